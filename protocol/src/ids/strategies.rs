//! Proptest strategies for identifiers, shared by the crate's property tests.

use proptest::prelude::*;

use super::SYSTEM_ID_PREFIX;

/// An identity token of 1 to `max` characters from `[A-Za-z0-9_-]` that is not reserved for
/// the system (it does not start with [`SYSTEM_ID_PREFIX`]).
pub fn token(max: usize) -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[A-Za-z0-9_-]{{1,{max}}}"))
        .expect("a valid regex")
        .prop_filter("not a reserved system id", |s: &String| {
            !s.starts_with(SYSTEM_ID_PREFIX)
        })
}
