//! The settling half of the reply side: EXEC's array (mirror what ran,
//! splice in the locally answered pushes, apply a queued SELECT) and the Postgres write of a
//! locally answered push.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;

use super::super::command::{one_line, LocalPush, LocalStore};
use super::super::frame::{self, Frame};
use super::super::link::Shared;
use super::super::session::{is_confirmation, took, Entry};
use super::super::set_pop::handed_out;
use super::Replies;
use crate::metrics as m;
use crate::model::formats::decode_bytes;

impl<R: tokio::io::AsyncRead + Unpin> Replies<R> {
    /// EXEC's array arrived: mirror the pushes Redis ran successfully, write
    /// the locally answered pushes to Postgres, and splice their results in
    /// at their places in command order.
    pub(super) async fn exec(&mut self, entries: Vec<Entry>, frame: Option<Frame>, bytes: &[u8]) {
        let Some(Frame::Array(results)) = frame else {
            self.answer(bytes);
            return;
        };
        let queued = entries
            .iter()
            .filter(|e| matches!(e, Entry::Redis(_) | Entry::Select(_) | Entry::Pop(_)))
            .count();
        if queued != results.len() {
            // Cannot happen with Redis's rules; if it does, pass the reply on
            // untouched rather than guess, and write nothing to Postgres.
            tracing::error!(
                conn = self.id,
                queued,
                results = results.len(),
                "EXEC reply does not match the queued commands; nothing mirrored"
            );
            self.answer(bytes);
            return;
        }
        if self.mute {
            // The client's replies are off: EXEC's array is withheld, but
            // the pub/sub confirmations in it are pushes Redis delivers.
            for frame in results.iter().filter(|f| is_confirmation(f)) {
                frame::encode(frame, &mut self.out);
            }
        }
        let local = entries.iter().any(|e| matches!(e, Entry::Local(_)));
        self.record_pops(&entries, &results).await;
        let mut results = results.into_iter();
        let mut spliced = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry {
                Entry::Redis(push) => {
                    let result = results.next().unwrap_or(Frame::Null);
                    if let Some(push) = push.filter(|_| took(Some(&result))) {
                        self.mirror(push).await;
                    }
                    spliced.push(Ok(result));
                }
                Entry::Pop(_) => spliced.push(Ok(results.next().unwrap_or(Frame::Null))),
                Entry::Select(db) => {
                    let result = results.next().unwrap_or(Frame::Null);
                    if matches!(&result, Frame::Simple(ok) if ok.as_ref() == b"OK") {
                        self.session.selected(db);
                    }
                    spliced.push(Ok(result));
                }
                // Started together, awaited in order below.
                Entry::Local(push) => {
                    spliced.push(Err(tokio::spawn(store(Arc::clone(&self.shared), push))))
                }
            }
        }
        if !local {
            self.answer(bytes);
            return;
        }
        let mut array = Vec::with_capacity(spliced.len());
        for slot in spliced {
            array.push(match slot {
                Ok(frame) => frame,
                Err(handle) => {
                    let result = self
                        .settle(handle)
                        .await
                        .unwrap_or_else(|e| Err(format!("store task failed: {e}")));
                    match result {
                        Ok(n) => Frame::Integer(i64::try_from(n).unwrap_or(i64::MAX)),
                        Err(reason) => {
                            Frame::Error(format!("ERR qbridge: {}", one_line(&reason)).into())
                        }
                    }
                }
            });
        }
        let mut encoded = Vec::new();
        frame::encode(&Frame::Array(array), &mut encoded);
        self.answer(&encoded);
    }
}

impl<R: tokio::io::AsyncRead + Unpin> Replies<R> {
    /// Records what the pops of a transaction handed out, before any of its
    /// locally answered pushes is stored: RQ's scheduler pushes a due job
    /// and takes it out of its registry in one MULTI, and the push must
    /// find the evidence when it is written (`ingest::promote`).
    async fn record_pops(&mut self, entries: &[Entry], results: &[Frame]) {
        let db = self.session.next_db();
        let mut results = results.iter();
        for entry in entries {
            let result = match entry {
                Entry::Local(_) => continue,
                Entry::Redis(_) | Entry::Select(_) | Entry::Pop(_) => results.next(),
            };
            if let (Entry::Pop(pop), Some(result)) = (entry, result) {
                let mut members = handed_out(pop, result);
                if pop.fields && !members.is_empty() {
                    // The entries read whose message this transaction pushes.
                    let pushed = pushed_keys(entries);
                    members = pop.held.clone();
                    let routes = &self.shared.routes;
                    members.retain(|value| {
                        let job = db.and_then(|db| routes.set_job(db, &pop.set, value));
                        job.is_some_and(|(route, job)| {
                            let key = decode_bytes(&route.format, Bytes::from(job)).key;
                            pushed.contains(&(route.name.clone(), key.with_occurrence(0)))
                        })
                    });
                }
                if !members.is_empty() {
                    self.record_released(pop.clone(), members, db).await;
                }
            }
        }
    }
}

/// The (route, job key) of every item a transaction pushes on a routed
/// list, answered locally or by Redis.
fn pushed_keys(entries: &[Entry]) -> HashSet<(String, String)> {
    let mut keys = HashSet::new();
    for entry in entries {
        let (route, items) = match entry {
            Entry::Local(LocalPush {
                route,
                store: LocalStore::Deferred(items, _),
                ..
            }) => (route, items),
            Entry::Redis(Some(push)) if push.due.is_none() => (&push.route, &push.items),
            _ => continue,
        };
        for item in items {
            let key = decode_bytes(&route.format, item.clone()).key;
            keys.insert((route.name.clone(), key.with_occurrence(0)));
        }
    }
    keys
}

/// Writes a locally answered push to Postgres (or collects the write the
/// reader started) and counts the result.
pub(super) async fn store(shared: Arc<Shared>, push: LocalPush) -> Result<usize, String> {
    let route = push.route.name.clone();
    let result = match push.store {
        LocalStore::Started(handle) => handle
            .await
            .unwrap_or_else(|e| Err(format!("store task failed: {e}"))),
        LocalStore::Deferred(items, routed) => shared
            .mirror
            .store_live_routed(Arc::clone(&push.route), items, Some(routed))
            .await
            .map(|stored| stored.len())
            .map_err(|e| e.to_string()),
    };
    let label = if result.is_ok() { "ok" } else { "error" };
    metrics::counter!(m::PROXY_POSTGRES_WRITES, "route" => route, "result" => label)
        .increment(push.items as u64);
    result
}
