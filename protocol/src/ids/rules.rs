//! The character rules shared by every id, name and subject token.

use super::IdError;

/// The set of characters a value may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charset {
    /// `[A-Za-z0-9_-]`: safe as a subject token, inside a consumer name and
    /// as a file name.
    Token,
    /// Printable ASCII except space (`0x21..=0x7e`).
    Printable,
    /// What JetStream accepts as a stream or consumer name: anything except
    /// `.`, `*`, `>`, path separators, whitespace and control characters.
    NatsName,
}

impl Charset {
    fn allows(self, ch: char) -> bool {
        match self {
            Charset::Token => ch.is_ascii_alphanumeric() || ch == '_' || ch == '-',
            Charset::Printable => ch.is_ascii_graphic(),
            Charset::NatsName => {
                !(ch.is_whitespace()
                    || ch.is_control()
                    || matches!(ch, '.' | '*' | '>' | '/' | '\\'))
            }
        }
    }
}

/// Checks `value` against a length limit, a charset and a list of reserved
/// words, in that order.
pub(crate) fn check(
    value: &str,
    kind: &'static str,
    max: usize,
    charset: Charset,
    reserved: &[&str],
) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if value.len() > max {
        return Err(IdError::TooLong {
            kind,
            max,
            len: value.len(),
        });
    }
    if let Some((index, ch)) = value.char_indices().find(|&(_, ch)| !charset.allows(ch)) {
        return Err(IdError::InvalidChar { kind, ch, index });
    }
    if reserved.contains(&value) {
        return Err(IdError::Reserved {
            kind,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// Checks that `value` starts with none of the `reserved` prefixes.
pub(crate) fn check_prefixes(
    value: &str,
    kind: &'static str,
    reserved: &[&'static str],
) -> Result<(), IdError> {
    match reserved.iter().find(|p| value.starts_with(**p)) {
        Some(&prefix) => Err(IdError::ReservedPrefix {
            kind,
            prefix,
            value: value.to_owned(),
        }),
        None => Ok(()),
    }
}
