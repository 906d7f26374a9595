//! The units of the config file: durations (`"250ms"`, `"30s"`, `"5m"`, `"1h"`,
//! `"1d"`) and sizes (`"1MiB"`, `"512KiB"`, `"100B"` or a bare byte count).
//! Out-of-range values are one-line errors, never a panic or a wrap-around.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};

/// A duration written as `"500ms"`, `"30s"`, `"5m"`, `"2h"` or `"1d"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

/// Parses a duration string (see [`Dur`]). The units and the integer forms
/// are humantime's (`"30s"`, `"5min"`, `"1h 30m"`; it refuses overflow); a
/// decimal such as `"1.5s"`, which humantime does not take, is the number
/// times humantime's length of one unit.
pub fn parse_duration(text: &str) -> Result<Duration> {
    let t = text.trim();
    let bad = |why: &dyn std::fmt::Display| {
        Error::Config(format!(
            "bad duration {text:?}: {why} (use e.g. \"500ms\", \"30s\", \"5m\")"
        ))
    };
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if !num.contains('.') {
        return humantime::parse_duration(t).map_err(|e| bad(&e));
    }
    let value: f64 = num.parse().map_err(|_| bad(&"not a number"))?;
    let one = humantime::parse_duration(&format!("1{unit}")).map_err(|e| bad(&e))?;
    // try_: from_secs_f64 panics on a finite value too large for a Duration.
    Duration::try_from_secs_f64(value * one.as_secs_f64()).map_err(|_| bad(&"out of range"))
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// A size written as bytes (`1048576`) or with a unit (`"1MiB"`, `"64KiB"`).
///
/// Parsed here rather than by `bytesize`: that crate multiplies through an
/// `f64` and casts, so a size too large for the machine saturates or rounds
/// silently, where a limit such as `mirror_buffer` must be exact or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub usize);

/// Parses a size string (see [`Bytes`]).
pub fn parse_size(text: &str) -> Result<usize> {
    let t = text.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("MiB") {
        (n, 1024 * 1024)
    } else if let Some(n) = t.strip_suffix("KiB") {
        (n, 1024)
    } else if let Some(n) = t.strip_suffix('B') {
        (n, 1)
    } else {
        (t, 1)
    };
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| Error::Config(format!("bad size {text:?}: use e.g. \"1MiB\"")))?;
    n.checked_mul(mult)
        .ok_or_else(|| Error::Config(format!("bad size {text:?}: out of range")))
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => usize::try_from(n)
                .map(Bytes)
                .map_err(|_| serde::de::Error::custom(format!("bad size {n}: out of range"))),
            Raw::S(s) => parse_size(&s)
                .map(Bytes)
                // The text without the "config: " prefix: toml adds the key.
                .map_err(|e| match e {
                    Error::Config(m) => serde::de::Error::custom(m),
                    other => serde::de::Error::custom(other),
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("s").is_err());
    }

    /// Finite but beyond what a Duration holds: an error, not a panic.
    #[test]
    fn huge_durations_are_errors() {
        for text in [
            "99999999999999999999d",
            "1e300s",
            "340282366920938463463374607431768211456s",
        ] {
            let err = parse_duration(text).unwrap_err().to_string();
            assert!(
                err.contains("out of range") || err.contains("bad duration"),
                "{err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1MiB").unwrap(), 1024 * 1024);
        assert_eq!(parse_size("64KiB").unwrap(), 64 * 1024);
        assert_eq!(parse_size("100B").unwrap(), 100);
        assert_eq!(parse_size("7").unwrap(), 7);
        assert!(parse_size("lots").is_err());
    }

    /// Parses as a usize, overflows once multiplied: an error, not a panic
    /// (debug) or a wrapped small limit (release).
    #[test]
    fn overflowing_sizes_are_errors() {
        let text = format!("{}MiB", usize::MAX / 1024);
        let err = parse_size(&text).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
        let text = format!("{}KiB", usize::MAX);
        assert!(parse_size(&text).is_err());
    }

    /// Fuzz-style properties: any text is a value or a one-line error that
    /// quotes it (escaped), and well-formed values mean exactly what they say.
    mod props {
        use super::*;
        use proptest::prelude::*;

        /// Text made of the pieces units are spelled with, and some that are not.
        fn unit_soup() -> impl Strategy<Value = String> {
            const PIECES: &[&str] = &[
                "0",
                "1",
                "9",
                "18446744073709551616",
                ".",
                "-",
                "+",
                "e",
                "ms",
                "s",
                "m",
                "h",
                "d",
                "MiB",
                "KiB",
                "B",
                " ",
                "\n",
                "\"",
                "µ",
                "NaN",
                "inf",
            ];
            proptest::collection::vec(proptest::sample::select(PIECES), 0..8)
                .prop_map(|p| p.concat())
        }

        fn one_line(e: &Error, prefix: &str) -> Result<(), TestCaseError> {
            let text = e.to_string();
            prop_assert!(!text.contains(['\r', '\n']), "{:?}", text);
            prop_assert!(text.contains(prefix), "{:?}", text);
            Ok(())
        }

        proptest! {
            #[test]
            fn any_text_is_a_value_or_a_one_line_error(text in prop_oneof![any::<String>(), unit_soup()]) {
                if let Err(e) = parse_duration(&text) {
                    one_line(&e, "bad duration")?;
                }
                if let Err(e) = parse_size(&text) {
                    one_line(&e, "bad size")?;
                }
            }

            #[test]
            fn durations_mean_what_they_say(n in 0u64..(1 << 32), unit in proptest::sample::select(&["ms", "s", "m", "h", "d"][..])) {
                let got = parse_duration(&format!("{n}{unit}")).unwrap();
                let want = match unit {
                    "ms" => Duration::from_millis(n),
                    "s" => Duration::from_secs(n),
                    "m" => Duration::from_secs(n * 60),
                    "h" => Duration::from_secs(n * 3600),
                    _ => Duration::from_secs(n * 86400),
                };
                // Milliseconds pass through a float division: allow rounding.
                prop_assert!(got.abs_diff(want) <= Duration::from_micros(1), "{:?} vs {:?}", got, want);
            }

            #[test]
            fn sizes_mean_what_they_say_or_overflow(n in any::<u64>(), unit in proptest::sample::select(&[("", 1u64), ("B", 1), ("KiB", 1024), ("MiB", 1 << 20)][..])) {
                let got = parse_size(&format!("{n}{}", unit.0));
                match n.checked_mul(unit.1).and_then(|b| usize::try_from(b).ok()) {
                    Some(want) => prop_assert_eq!(got.unwrap(), want),
                    None => one_line(&got.unwrap_err(), "out of range")?,
                }
            }
        }
    }
}
