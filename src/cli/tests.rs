//! The help an operator reads at 3 a.m. says only what each command takes.

use clap::CommandFactory;

use super::Cli;

fn help(path: &[&str]) -> String {
    let mut cmd = Cli::command();
    let mut at = &mut cmd;
    for name in path {
        at = at.find_subcommand_mut(name).expect("the subcommand exists");
    }
    at.render_long_help().to_string()
}

#[test]
fn rollback_offers_no_force_and_no_share() {
    let text = help(&["cutover", "rollback"]);
    assert!(!text.contains("--force"), "{text}");
    assert!(!text.contains("--percent"), "{text}");
    assert!(
        text.contains("--reason") && text.contains("Example"),
        "{text}"
    );
}

#[test]
fn advance_keeps_force_and_percent() {
    let text = help(&["cutover", "advance"]);
    assert!(
        text.contains("--force") && text.contains("--percent"),
        "{text}"
    );
}

#[test]
fn status_shows_an_example() {
    let text = help(&["cutover", "status"]);
    assert!(
        text.contains("Example:\n  qbridge --config qbridge.toml cutover status"),
        "{text}"
    );
}
