//! clap definitions (written next).
