//! CLI subcommand implementations (written next).
