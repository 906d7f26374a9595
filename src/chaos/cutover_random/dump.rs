//! What a failed content-hash seed leaves for a reader: for each text a
//! violation names, every row the numbering wrote about it (pushes and pops
//! counted, write ids, holes, job keys, outcomes, the ledger's runs), as
//! text in `$QBRIDGE_CHAOS_DUMP_DIR/seed-<n>.txt`. The throwaway servers are
//! gone a moment later; this is how a campaign's failure gets diagnosed.
//! Test payloads only (the load's own texts): nothing personal is written.

use std::fmt::Write as _;

use sqlx::PgPool;

/// The queries, each with `$1` = `sha256:<hex>` (the key without its number).
const QUERIES: &[(&str, &str)] = &[
    ("counts", "SELECT side, n FROM qbridge.key_occurrences WHERE 'sha256:' || hash = $1 ORDER BY side"),
    ("holes", "SELECT n FROM qbridge.pop_holes WHERE 'sha256:' || hash = $1 ORDER BY n"),
    ("writes", "SELECT write_id, key, at FROM qbridge.numbered_writes WHERE (key = $1 OR key LIKE $1 || ':%') ORDER BY at"),
    ("job_keys", "SELECT key, copy, via, seen_at, original IS NOT NULL AS has_bytes FROM qbridge.job_keys WHERE (key = $1 OR key LIKE $1 || ':%') ORDER BY seen_at"),
    ("jobs", "SELECT id, key, copy, state, attempts FROM qbridge.jobs WHERE (key = $1 OR key LIKE $1 || ':%') ORDER BY id"),
    ("outcomes", "SELECT key, side, mode, outcome, recorded_at FROM qbridge.outcomes WHERE (key = $1 OR key LIKE $1 || ':%') ORDER BY recorded_at"),
    ("held", "SELECT key FROM qbridge.held_repushes WHERE (key = $1 OR key LIKE $1 || ':%')"),
    ("ledger", "SELECT key, job_id, attempt, mode, ok, at FROM chaos.ledger WHERE (key = $1 OR key LIKE $1 || ':%') ORDER BY at"),
    ("pushes", "SELECT via, count(*) FROM chaos.pushes WHERE hash = $1 GROUP BY via"),
    ("outbox", "SELECT key, original IS NOT NULL AS has_bytes FROM qbridge.redis_outbox WHERE (key = $1 OR key LIKE $1 || ':%')"),
];

/// Writes the dump of `seed` when `QBRIDGE_CHAOS_DUMP_DIR` is set, for each
/// text or key a violation names; errors are reported in the file, never raised.
pub(super) async fn write(db: &PgPool, seed: u64, violations: &[String], steps: &[String]) {
    let Ok(dir) = std::env::var("QBRIDGE_CHAOS_DUMP_DIR") else {
        return;
    };
    let hashes = named(violations);
    let mut out = format!("seed {seed}\nviolations:\n");
    for v in violations {
        let _ = writeln!(out, "  {v}");
    }
    let _ = writeln!(out, "steps:\n  {}", steps.join("\n  "));
    for hash in hashes {
        let _ = writeln!(out, "\n== {hash}");
        for (name, sql) in QUERIES {
            let _ = writeln!(out, "-- {name}");
            let wrapped = format!("SELECT row_to_json(t)::text FROM ({sql}) t");
            match sqlx::query_scalar::<_, String>(&wrapped)
                .bind(&hash)
                .fetch_all(db)
                .await
            {
                Ok(rows) => rows.iter().for_each(|r| {
                    let _ = writeln!(out, "{r}");
                }),
                Err(e) => {
                    let _ = writeln!(out, "(failed: {e})");
                }
            }
        }
    }
    let path = std::path::Path::new(&dir).join(format!("seed-{seed}.txt"));
    let _ = std::fs::create_dir_all(&dir);
    if let Err(e) = std::fs::write(&path, out) {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the seed's dump");
    }
}

/// Copies the rig's process logs (qbridge logs no payloads) beside the
/// dump, as `seed-<n>-<process>.log`, when `QBRIDGE_CHAOS_DUMP_DIR` is set.
pub(super) fn keep_logs(rig_dir: &std::path::Path, seed: u64) {
    let Ok(dir) = std::env::var("QBRIDGE_CHAOS_DUMP_DIR") else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(rig_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(process) = name.strip_suffix(".log") {
            let to = std::path::Path::new(&dir).join(format!("seed-{seed}-{process}.log"));
            let _ = std::fs::copy(entry.path(), to);
        }
    }
}

/// What the violations name: texts (`sha256:<hex>`) and id keys (`key <id>`,
/// `e.g. <id>`).
fn named(violations: &[String]) -> Vec<String> {
    let mut names: Vec<String> = violations
        .iter()
        .flat_map(|v| {
            let texts = v
                .match_indices("sha256:")
                .filter_map(|(i, _)| v.get(i..i + 71));
            let ids = ["key ", "e.g. "]
                .into_iter()
                .flat_map(|lead| {
                    v.match_indices(lead)
                        .filter_map(move |(i, _)| v[i + lead.len()..].split([',', ')', ' ']).next())
                })
                .filter(|k| !k.is_empty() && !k.starts_with("sha256:"));
            texts.chain(ids).map(str::to_string).collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Writes what every Redis list holds, per text (`<list>: <hash prefix> ×
/// <copies>`), to `$QBRIDGE_CHAOS_DUMP_DIR/seed-<n>-redis-<when>.txt` when
/// the variable is set: the walk calls it when a drain fails, before the
/// decommission archives the lists.
pub(super) async fn redis_lists(url: &str, seed: u64, when: &str) {
    use sha2::{Digest, Sha256};
    let Ok(dir) = std::env::var("QBRIDGE_CHAOS_DUMP_DIR") else {
        return;
    };
    let mut out = String::new();
    let read = async {
        let mut conn = crate::redis::connect::connect_redis(url).await?;
        let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query_async(&mut conn).await?;
        for key in keys {
            let kind: String = ::redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut conn)
                .await?;
            if kind != "list" {
                continue;
            }
            let items: Vec<Vec<u8>> = ::redis::cmd("LRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            let mut texts: std::collections::BTreeMap<String, usize> = Default::default();
            for item in &items {
                let hex: String = Sha256::digest(item)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                *texts.entry(hex[..12].to_string()).or_default() += 1;
            }
            let _ = writeln!(out, "{key}: {} items {texts:?}", items.len());
        }
        Ok::<(), crate::error::Error>(())
    };
    if let Err(e) = read.await {
        let _ = writeln!(out, "(failed: {e})");
    }
    let path = std::path::Path::new(&dir).join(format!("seed-{seed}-redis-{when}.txt"));
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(path, out);
}

#[cfg(test)]
mod tests {
    #[test]
    fn violations_name_texts_and_id_keys() {
        let hex = "a".repeat(64);
        let violations = [
            format!("1 acknowledged jobs lost, e.g. sha256:{hex} (3 pushed, 2 ran)"),
            "2 jobs ran live on both sides, the diff shows 0 (ledger: key a-9, key p-1)".into(),
            // The oracle's repeated runs name their example this way (seed
            // 50255's dump had no rows: this was not read).
            "1× ran live on both sides, e.g. a-15".into(),
            "1× second live run while the first lease was valid, e.g. a-15".into(),
        ];
        assert_eq!(
            super::named(&violations),
            ["a-15", "a-9", "p-1", &format!("sha256:{hex}")]
        );
    }
}
