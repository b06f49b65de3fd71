//! Values taken one after the other from a fuzzer's bytes (zeros once they run out).

/// A cursor over the fuzzer's bytes.
pub(crate) struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes(data)
    }

    pub(crate) fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    pub(crate) fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// A number: one byte says how many bytes follow (so small numbers are cheap to reach).
    pub(crate) fn u64(&mut self) -> u64 {
        let len = usize::from(self.byte() % 9);
        (0..len).fold(0, |n, _| n << 8 | u64::from(self.byte()))
    }

    /// `None` or a number.
    pub(crate) fn opt_u64(&mut self) -> Option<u64> {
        self.flag().then(|| self.u64())
    }

    /// A string: one byte says how long, then its bytes, made UTF-8.
    pub(crate) fn text(&mut self) -> String {
        let len = usize::from(self.byte() % 64).min(self.0.len());
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8_lossy(text).into_owned()
    }

    /// `None` or a string.
    pub(crate) fn opt_text(&mut self) -> Option<String> {
        self.flag().then(|| self.text())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
