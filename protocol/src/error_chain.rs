//! An error and its causes on one line ([`ErrorChain`]): what a log line, a status field or a
//! notice shows of an error.
//!
//! The workspace's errors follow the std convention: a message names what failed, and its
//! cause is its [`source`](std::error::Error::source), never repeated in the message. So
//! showing an error means showing its chain. Some libraries' errors (async-nats's kinds) also
//! print their source in their own message; a link whose text is already shown is skipped, so
//! no cause appears twice.
//!
//! ```
//! use protocol::error_chain::ErrorChain;
//!
//! #[derive(Debug, thiserror::Error)]
//! #[error("cannot read the journal")]
//! struct Outer(#[source] std::io::Error);
//!
//! let e = Outer(std::io::Error::other("disk gone"));
//! assert_eq!(ErrorChain(&e).to_string(), "cannot read the journal: disk gone");
//! ```

use std::error::Error;
use std::fmt;

/// Displays an error and every source below it, `outer: inner: innermost`, on one line; a
/// link whose text the line already holds is left out.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = String::new();
        let mut next = Some(self.0);
        while let Some(error) = next {
            let text = error.to_string();
            if !text.is_empty() && !line.contains(&text) {
                if !line.is_empty() {
                    line.push_str(": ");
                }
                line.push_str(&text);
            }
            next = error.source();
        }
        f.write_str(&line.replace('\n', " "))
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    /// A library error that prints its source in its own message too.
    #[derive(Debug)]
    struct Repeats(std::io::Error);

    impl fmt::Display for Repeats {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "timed out: {}", self.0)
        }
    }

    impl Error for Repeats {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn every_link_is_shown_once_in_order() {
        let e = Outer(Middle(std::io::Error::other("innermost")));
        assert_eq!(ErrorChain(&e).to_string(), "outer: middle: innermost");
        let e = Repeats(std::io::Error::other("no answer"));
        assert_eq!(ErrorChain(&e).to_string(), "timed out: no answer");
        let e = std::io::Error::other("two\nlines");
        assert_eq!(ErrorChain(&e).to_string(), "two lines");
    }
}
