//! The `dtask` command-line tool: inspect, verify, export and import dtask journals, and run
//! the demo workload. See `docs/cli.md`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::run()
}
