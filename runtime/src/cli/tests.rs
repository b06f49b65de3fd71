use super::*;

fn usage(args: &[&str]) -> String {
    match parse_args(std::iter::once("runtime").chain(args.iter().copied())) {
        Parsed::Usage(line) => line,
        other => panic!("expected a usage error for {args:?}, got {other:?}"),
    }
}

#[test]
fn worker_role_without_worker_id_is_a_usage_error() {
    let line = usage(&["start", "--role", "worker"]);
    assert!(line.contains("--worker-id"), "{line}");
    assert!(!line.contains('\n'));
}

#[test]
fn unknown_flag_is_one_line() {
    let line = usage(&["start", "--role", "router", "--durabel"]);
    assert!(line.contains("--durabel"), "{line}");
    assert!(!line.contains('\n'));
}

#[test]
fn router_flags_parse() {
    let Parsed::Run(cli) = parse_args([
        "runtime",
        "start",
        "--role",
        "router",
        "--durable",
        "--delivery-config",
        "d.json",
        "--nats-url",
        "nats://127.0.0.1:1",
        "--log-format",
        "json",
    ]) else {
        panic!("expected to parse");
    };
    let Command::Start(start) = &cli.command else {
        panic!("expected start")
    };
    assert_eq!(start.role, Role::Router);
    assert!(start.durable);
    assert_eq!(start.delivery_config, Some(PathBuf::from("d.json")));
    assert_eq!(start.nats.nats_url, "nats://127.0.0.1:1");
    assert_eq!(cli.log_format, LogFormat::Json);
}

#[test]
fn help_is_printed_not_an_error() {
    assert!(matches!(
        parse_args(["runtime", "--help"]),
        Parsed::Print(_)
    ));
}

#[test]
fn every_option_has_a_doc_comment() {
    use clap::CommandFactory;
    fn check(cmd: &clap::Command) {
        for arg in cmd.get_arguments() {
            if arg.get_id() == "help" || arg.get_id() == "version" {
                continue;
            }
            assert!(
                arg.get_help().is_some(),
                "option {} of `{}` has no doc comment",
                arg.get_id(),
                cmd.get_name()
            );
        }
        for sub in cmd.get_subcommands() {
            check(sub);
        }
    }
    check(&Cli::command());
}
