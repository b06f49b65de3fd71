//! Examples live in this folder as cargo examples; see `embedded_host.rs`.
//!
//! [`args`] is the command-line handling they share.

pub mod args {
    //! Each example takes a few optional positive numbers, or nothing. `-h`/`--help` prints
    //! the usage on stdout and exits 0; arguments that do not fit print one line on stderr
    //! (what is wrong, then the usage) and exit [`EXIT_USAGE`], before anything starts.

    /// The exit code of a usage error (`EX_USAGE`), the `runtime` binary's.
    pub use runtime::exit::USAGE as EXIT_USAGE;

    /// What the arguments asked for.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Parsed {
        /// `-h` or `--help`.
        Help,
        /// One value per name; `None` where the argument was left out.
        Values(Vec<Option<u64>>),
    }

    /// Parses `args` (without the program name) as at most `names.len()` positive integers,
    /// in that order.
    ///
    /// # Errors
    /// What is wrong, naming the argument, e.g. ``N must be a positive integer, got "x"``.
    pub fn parse<I, S>(names: &[&str], args: I) -> Result<Parsed, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let args: Vec<String> = args.into_iter().map(Into::into).collect();
        if args.iter().any(|a| a == "-h" || a == "--help") {
            return Ok(Parsed::Help);
        }
        if names.is_empty() && !args.is_empty() {
            return Err(format!("takes no arguments, got {:?}", args[0]));
        }
        if args.len() > names.len() {
            return Err(format!(
                "takes at most {} arguments, got {}",
                names.len(),
                args.len()
            ));
        }
        let mut values = vec![None; names.len()];
        for (i, arg) in args.iter().enumerate() {
            match arg.parse::<u64>() {
                Ok(v) if v > 0 => values[i] = Some(v),
                _ => {
                    return Err(format!(
                        "{} must be a positive integer, got {arg:?}",
                        names[i]
                    ))
                }
            }
        }
        Ok(Parsed::Values(values))
    }

    /// `usage: <program> [NAME]...` for `names`.
    pub fn usage(program: &str, names: &[&str]) -> String {
        let mut line = format!("usage: {program}");
        for name in names {
            line.push_str(&format!(" [{name}]"));
        }
        line
    }

    /// Prints `usage: <program> ...` and `help` (what the arguments mean) on stdout and exits 0
    /// on `-h`/`--help`; prints `<program>: <what is wrong>; usage: ...` on stderr and exits
    /// [`EXIT_USAGE`] when the process's arguments do not fit `names`. Returns the values
    /// otherwise.
    pub fn from_env_or_exit(program: &str, names: &[&str], help: &str) -> Vec<Option<u64>> {
        match parse(names, std::env::args().skip(1)) {
            Ok(Parsed::Values(values)) => values,
            Ok(Parsed::Help) => {
                println!("{}", usage(program, names));
                if !help.is_empty() {
                    println!("{help}");
                }
                std::process::exit(0);
            }
            Err(wrong) => usage_error(program, names, &wrong),
        }
    }

    /// Prints `<program>: <wrong>; usage: ...` on one line to stderr and exits [`EXIT_USAGE`].
    pub fn usage_error(program: &str, names: &[&str], wrong: &str) -> ! {
        eprintln!("{program}: {wrong}; {}", usage(program, names));
        std::process::exit(EXIT_USAGE);
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const NAMES: [&str; 3] = ["N", "PACED_SECS", "ROUNDS"];

        #[test]
        fn values_in_order_and_left_out_ones_are_none() {
            assert_eq!(
                parse(&NAMES, ["7", "2"]),
                Ok(Parsed::Values(vec![Some(7), Some(2), None]))
            );
            assert_eq!(
                parse(&NAMES, Vec::<String>::new()),
                Ok(Parsed::Values(vec![None, None, None]))
            );
        }

        #[test]
        fn help_wins_anywhere() {
            assert_eq!(parse(&NAMES, ["x", "--help"]), Ok(Parsed::Help));
            assert_eq!(parse(&[], ["-h"]), Ok(Parsed::Help));
        }

        #[test]
        fn wrong_arguments_say_what_is_wrong() {
            assert_eq!(
                parse(&NAMES, ["x"]),
                Err("N must be a positive integer, got \"x\"".into())
            );
            assert!(parse(&NAMES, ["0"]).is_err());
            assert!(parse(&NAMES, ["-1"]).is_err());
            assert_eq!(
                parse(&NAMES, ["1", "2", "3", "4"]),
                Err("takes at most 3 arguments, got 4".into())
            );
            assert_eq!(
                parse(&[], ["extra"]),
                Err("takes no arguments, got \"extra\"".into())
            );
            assert_eq!(
                usage("bench_dm", &NAMES),
                "usage: bench_dm [N] [PACED_SECS] [ROUNDS]"
            );
            assert_eq!(usage("embedded_host", &[]), "usage: embedded_host");
        }
    }
}
