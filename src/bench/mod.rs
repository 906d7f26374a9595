//! `qbridge bench` (written next).
