//! The proxy bench's output: a table for people, [`BenchReport`] numbers for
//! `--json`, the targets next to what was measured.

use super::ProxyRun;
use crate::bench::BenchReport;
use crate::output::table;

// The targets: the proxy's rate against direct Redis; the mirror's against the
// proxy's own splice (mirroring on at >= 0.9x its rate with mirroring off,
// at depth 1) and for the mirror's sustained rate.
const TARGET_RATIO: f64 = 0.5;
const TARGET_SPLICE_RATIO: f64 = 0.9;
const TARGET_MIRROR_ITEMS_S: f64 = 35_000.0;
const TARGET_ADDED_P99_MS: f64 = 2.0;
const TARGET_LAG_P99_MS: f64 = 100.0;

impl ProxyRun {
    /// Every proxy push became exactly one mirror copy in Postgres.
    pub fn all_mirrored(&self) -> bool {
        self.mirrored == self.pushed as i64
    }

    fn ratio(&self) -> f64 {
        self.proxy.ops_s() / self.direct.ops_s().max(1e-9)
    }

    /// The mirroring proxy over its splice alone, when that was measured.
    fn splice_ratio(&self) -> Option<f64> {
        let splice = self
            .references
            .iter()
            .find(|(n, _)| *n == "qbridge splice")?;
        Some(self.proxy.ops_s() / splice.1.ops_s().max(1e-9))
    }

    fn added_p50(&self) -> f64 {
        self.proxy.p50 - self.direct.p50
    }

    fn added_p99(&self) -> f64 {
        self.proxy.p99 - self.direct.p99
    }

    fn lag(&self, p: f64) -> f64 {
        crate::bench::harness::percentile(&self.lag_ms, p)
    }

    /// (what, target, met) — only meaningful without a stall, and the ratio
    /// target is stated for depth 1.
    fn targets(&self) -> Vec<(&'static str, String, Option<bool>)> {
        let applies = self.stall.is_none() && self.args.phase == "dual_write";
        let judge = |met: bool, also: bool| (applies && also).then_some(met);
        vec![
            (
                "proxy/direct throughput",
                format!(">= {TARGET_RATIO:.2} (8 clients, depth 1)"),
                judge(
                    self.ratio() >= TARGET_RATIO,
                    self.args.depth == 1 && self.args.items <= 1,
                ),
            ),
            (
                "mirroring / splice alone",
                format!(">= {TARGET_SPLICE_RATIO:.2} (depth 1)"),
                self.splice_ratio().and_then(|r| {
                    let plain = self.args.depth == 1 && self.args.rate == 0 && self.args.items <= 1;
                    judge(r >= TARGET_SPLICE_RATIO, plain)
                }),
            ),
            (
                "mirrored items/s",
                format!(">= {TARGET_MIRROR_ITEMS_S:.0} (unpaced)"),
                judge(
                    self.mirror_items_s >= TARGET_MIRROR_ITEMS_S,
                    self.args.rate == 0,
                ),
            ),
            (
                "added latency p99",
                format!("<= {TARGET_ADDED_P99_MS} ms"),
                judge(self.added_p99() <= TARGET_ADDED_P99_MS, true),
            ),
            (
                "mirror lag p99",
                format!("< {TARGET_LAG_P99_MS} ms"),
                judge(self.lag(99.0) < TARGET_LAG_P99_MS, true),
            ),
        ]
    }

    /// Numbers and notes for `--json` (and the generic printer).
    pub fn report(&self) -> BenchReport {
        let mut numbers = Vec::new();
        let sides = self.sides();
        for (name, side) in &sides {
            let name = name.replace(' ', "_");
            numbers.push((format!("{name}_ops_s"), side.ops_s()));
            numbers.push((format!("{name}_p50_ms"), side.p50));
            numbers.push((format!("{name}_p99_ms"), side.p99));
            numbers.push((format!("{name}_p999_ms"), side.p999));
            numbers.push((format!("{name}_max_ms"), side.max));
        }
        let mut more = vec![
            ("ratio_proxy_direct", self.ratio()),
            ("ratio_proxy_splice", self.splice_ratio().unwrap_or(0.0)),
            ("mirrored_items_s", self.mirror_items_s),
            ("added_p50_ms", self.added_p50()),
            ("added_p99_ms", self.added_p99()),
            ("mirror_lag_p50_ms", self.lag(50.0)),
            ("mirror_lag_p99_ms", self.lag(99.0)),
            (
                "mirror_lag_max_ms",
                self.lag_ms.last().copied().unwrap_or(0.0),
            ),
            ("proxy_pushed", self.pushed as f64),
            ("mirrored", self.mirrored as f64),
            ("rss_before_proxy_mib", self.rss_before_mib),
            ("rss_peak_proxy_mib", self.rss_peak_mib),
            (
                "mirror_buffer_mib",
                self.mirror.buffer_bytes as f64 / 1048576.0,
            ),
        ];
        if let Some(s) = &self.stall {
            more.extend([
                ("stall_locked_s", s.locked_secs),
                ("stall_before_ops_s", s.before_ops_s),
                ("stall_during_ops_s", s.during_ops_s),
                ("stall_after_ops_s", self.after_stall_ops_s()),
            ]);
        }
        numbers.extend(more.into_iter().map(|(k, v)| (k.to_string(), v)));
        let mut notes: Vec<String> = self
            .targets()
            .into_iter()
            .map(|(what, target, met)| format!("target {what} {target}: {}", verdict(met)))
            .collect();
        if !self.all_mirrored() {
            notes.push(self.mismatch());
        }
        let a = &self.args;
        BenchReport {
            system: "qbridge".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            mode: "proxy".into(),
            n: self.direct.ops + self.proxy.ops,
            settings: serde_json::json!({
                "clients": a.clients, "depth": a.depth, "duration_s": a.duration.as_secs_f64(),
                "payload_bytes": a.payload_bytes, "slow_postgres_s": a.slow_postgres.as_secs_f64(),
                "mirror_batch": self.mirror.batch_items, "mirror_writers": self.mirror.writers, "phase": a.phase,
                "mirror_linger_ms": self.mirror.linger.as_secs_f64() * 1e3,
                "rate": a.rate, "items": a.items.max(1), "twemproxy": !self.twemproxy_left_out,
            }),
            numbers,
            ok: self.all_mirrored(),
            notes,
        }
    }

    /// The human table.
    pub fn table(&self) -> String {
        let a = &self.args;
        let mut out = format!(
            "qbridge bench proxy: {} clients, depth {}, {} item(s) per LPUSH, {:?} per side, \
             {}-byte payloads, {}, route phase {}, mirror batch {} x {} writers, linger {:?}\n\n",
            a.clients,
            a.depth,
            a.items.max(1),
            a.duration,
            a.payload_bytes,
            match a.rate {
                0 => "unpaced".to_string(),
                r => format!("paced at {r} pushes/s"),
            },
            a.phase,
            self.mirror.batch_items,
            self.mirror.writers,
            self.mirror.linger
        );
        let rows: Vec<Vec<String>> = self
            .sides()
            .iter()
            .map(|(name, s)| {
                let ms = |v: f64| format!("{v:.3}");
                vec![
                    name.to_string(),
                    format!("{:.0}", s.ops_s()),
                    ms(s.p50),
                    ms(s.p99),
                    ms(s.p999),
                    ms(s.max),
                    s.ops.to_string(),
                ]
            })
            .collect();
        let head = [
            "side", "ops/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "commands",
        ];
        out.push_str(&table(&head, &rows));
        if self.twemproxy_left_out {
            out.push_str("\n(twemproxy: left out, --without-twemproxy)");
        }
        let targets = self.targets();
        let line = |what: &str, value: String, t: usize| {
            let (_, target, met) = &targets[t];
            format!(
                "  {what:<28} {value:>12}   target {target}: {}\n",
                verdict(*met)
            )
        };
        out.push('\n');
        out.push_str(&line(
            "proxy/direct throughput",
            format!("{:.2}", self.ratio()),
            0,
        ));
        if let Some(r) = self.splice_ratio() {
            out.push_str(&line("mirroring / splice alone", format!("{r:.2}"), 1));
        }
        let rate = format!("{:.0}", self.mirror_items_s);
        out.push_str(&line("mirrored items/s", rate, 2));
        out.push_str(&format!(
            "  {:<28} {:>12.3}\n",
            "added latency p50 (ms)",
            self.added_p50()
        ));
        out.push_str(&line(
            "added latency p99 (ms)",
            format!("{:.3}", self.added_p99()),
            3,
        ));
        let lag = format!("{:.1} / {:.1}", self.lag(50.0), self.lag(99.0));
        out.push_str(&line("mirror lag p50 / p99 (ms)", lag, 4));
        let max = self.lag_ms.last().copied().unwrap_or(0.0);
        out.push_str(&format!("  {:<28} {max:>12.1}\n", "mirror lag max (ms)"));
        out.push_str(&format!(
            "  {:<28} {:>12}   {}\n",
            "mirrored / pushed",
            format!("{} / {}", self.mirrored, self.pushed),
            if self.all_mirrored() {
                "ok"
            } else {
                "MISMATCH"
            }
        ));
        out.push_str(&format!(
            "  {:<28} {:>12.1}   (before the proxy phase {:.1}; mirror buffer {:.0} MiB)\n",
            "peak RSS, proxy phase (MiB)",
            self.rss_peak_mib,
            self.rss_before_mib,
            self.mirror.buffer_bytes as f64 / 1048576.0
        ));
        if let Some(s) = &self.stall {
            out.push_str(&format!(
                "\n  slow Postgres: qbridge.job_keys locked {:.1}s from {:.0}s into the proxy phase\n  \
                 proxy ops/s before / during / after the lock: {:.0} / {:.0} / {:.0}\n",
                s.locked_secs,
                super::STALL_AT.as_secs_f64(),
                s.before_ops_s,
                s.during_ops_s,
                self.after_stall_ops_s()
            ));
        }
        if !self.all_mirrored() {
            out.push_str(&format!("\n  !!! {} !!!\n", self.mismatch()));
        }
        out
    }

    /// Every measured side, in the order they ran, the mirroring proxy last.
    fn sides(&self) -> Vec<(&str, &super::Side)> {
        let mut sides = vec![("direct", &self.direct)];
        sides.extend(self.references.iter().map(|(n, s)| (*n, s)));
        let name = if self.args.phase == "dual_write" {
            "qbridge mirroring"
        } else {
            "qbridge splice"
        };
        sides.push((name, &self.proxy));
        sides
    }

    fn after_stall_ops_s(&self) -> f64 {
        let Some(s) = &self.stall else { return 0.0 };
        let left = self.proxy.secs - super::STALL_AT.as_secs_f64() - s.locked_secs;
        self.proxy.ops.saturating_sub(s.done_at_release) as f64 / left.max(1e-9)
    }

    fn mismatch(&self) -> String {
        format!(
            "MIRROR MISMATCH: {} mirror copies in Postgres for {} proxy pushes",
            self.mirrored, self.pushed
        )
    }
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "n/a",
    }
}
