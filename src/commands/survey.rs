//! `qbridge survey [--sample 5s] [--write-config FILE]`: what the Redis at
//! `--redis-url` holds (`ops::survey`), as a table or `--json`, with a
//! progress bar on stderr while the keyspace is walked, and optionally a
//! draft config. Needs no Postgres.

use std::io::Write as _;
use std::path::Path;

use crate::cli::SurveyArgs;
use crate::config::{parse_duration, Config};
use crate::error::{Error, Result};
use crate::ops::survey::{self, draft, render, Options};
use crate::output;
use crate::redis::connect::connect_redis_with;

pub async fn run(
    config: &Config,
    named_redis_url: &str,
    args: &SurveyArgs,
    as_json: bool,
) -> Result<()> {
    let sample =
        parse_duration(&args.sample).map_err(|e| Error::InvalidInput(format!("--sample: {e}")))?;
    if let Some(path) = &args.write_config {
        refuse_existing(path)?;
    }
    let mut conn = connect_redis_with(&config.redis_url, &config.redis_tls).await?;
    let bar = output::progress(0, as_json, "scanning keys");
    let mut progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    if !as_json && !sample.is_zero() {
        eprintln!(
            "survey: sampling push rates for {} after the scan",
            humantime::format_duration(sample)
        );
    }
    let found = survey::survey(&mut conn, &Options { sample }, &mut progress).await;
    bar.finish_and_clear();
    let found = found?;
    let written = match &args.write_config {
        Some(path) => {
            let text = draft::draft(&found, named_redis_url, config.redis_tls.ca_file());
            write_new(path, &text)?;
            Some(path.display().to_string())
        }
        None => None,
    };
    if as_json {
        let mut value = serde_json::to_value(&found)
            .map_err(|e| Error::InvalidInput(format!("cannot render JSON: {e}")))?;
        if let (Some(object), Some(path)) = (value.as_object_mut(), &written) {
            object.insert("draft_config".into(), path.clone().into());
        }
        output::json(&value);
    } else {
        print!("{}", render::text(&found));
        if let Some(path) = written {
            println!(
                "\ndraft config written to {path}: {} route(s) in redis_only; decide what its DECIDE comments ask",
                found.queues.len()
            );
        }
    }
    Ok(())
}

/// A one-line refusal when `path` exists: the survey never overwrites.
fn refuse_existing(path: &Path) -> Result<()> {
    if path.exists() {
        return Err(Error::Refused(format!(
            "{} exists: qbridge survey never overwrites a file (choose another --write-config path)",
            path.display()
        )));
    }
    Ok(())
}

/// Creates `path` with `text`, refusing a file that appeared since the
/// check.
fn write_new(path: &Path, text: &str) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::Refused(format!(
                "{} exists: qbridge survey never overwrites a file (choose another --write-config path)",
                path.display()
            )),
            _ => Error::InvalidInput(format!("cannot create {}: {e}", path.display())),
        })?;
    file.write_all(text.as_bytes())
        .map_err(|e| Error::InvalidInput(format!("cannot write {}: {e}", path.display())))
}
