//! The route table of a process: every configured route, found by its Redis
//! database and key (the proxy), its name (CLI, metrics) or its queue (HTTP
//! enqueue), with its current phase read through the shared [`PhaseView`].

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::{PushEnd, RouteConfig};
use crate::model::formats::{decode_bytes, Decoded, Format, KeySource};
use crate::model::phase::key_phase;
use crate::model::structures::{self, Structure};
use crate::model::{Phase, PhaseView};
use crate::shadow::Digester;

/// One route, as the producer paths and consumers use it.
#[derive(Debug)]
pub struct Route {
    /// Metric label and CLI name.
    pub name: String,
    /// The Redis list, as bytes: the proxy compares it with command arguments.
    pub redis_key: Bytes,
    /// The Redis database (SELECT index) the list is in.
    pub db: i64,
    /// The Postgres queue.
    pub queue: String,
    /// How list items are read.
    pub format: Format,
    /// The end of the list producers push to.
    pub push: PushEnd,
    /// Attempts of the Postgres copy (`None`: the queue default).
    pub max_attempts: Option<i32>,
    /// Response digests with the route's ignore rules, on both sides.
    pub digester: Digester,
    /// Everything else the route was configured with.
    pub config: RouteConfig,
}

impl Route {
    /// Every list the route's ready jobs wait in: `redis_key`, then the
    /// framework's priority lists (Celery's `<queue><sep><step>`,
    /// `model::structures::priority_lists`, named as the route's kombu
    /// options say).
    pub fn lists(&self) -> Vec<Bytes> {
        let mut lists = vec![self.redis_key.clone()];
        lists.extend(
            structures::priority_lists(&self.format, &self.redis_key, &self.config.keys)
                .into_iter()
                .map(Bytes::from),
        );
        lists
    }

    /// The framework's structures the route's jobs may wait in besides its
    /// lists (`model::structures::of_route`), named as the route's key
    /// options say.
    pub fn structures(&self) -> Vec<Structure> {
        structures::of_route(&self.format, &self.redis_key, &self.config.keys)
    }
}

/// A route owning members of a framework's set, and that set as the route
/// sees it (which members are its own).
type SetOwner = (Arc<Route>, Structure);

/// All routes of a process and their phases. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    list: Arc<Vec<Arc<Route>>>,
    /// Routes by key; one per database the key is routed in.
    by_key: Arc<HashMap<Bytes, Vec<Arc<Route>>>>,
    /// Framework sets whose additions are mirrored, by key, with the routes
    /// that own members of them.
    by_set: Arc<HashMap<Bytes, Vec<SetOwner>>>,
    /// Framework hashes of jobs a worker holds (kombu's `unacked`), by key:
    /// nothing added to them is mirrored; their removals are evidence.
    by_held: Arc<HashMap<Bytes, Vec<SetOwner>>>,
    phases: PhaseView,
}

impl Routes {
    /// A table of `configs` whose phases are read from `phases`.
    pub fn new(configs: &[RouteConfig], phases: PhaseView) -> Routes {
        let list: Vec<Arc<Route>> = configs
            .iter()
            .map(|c| {
                Arc::new(Route {
                    name: c.name.clone(),
                    redis_key: Bytes::copy_from_slice(c.redis_key.as_bytes()),
                    db: c.db,
                    queue: c.queue.clone(),
                    format: c.format.clone(),
                    push: c.push,
                    max_attempts: c.max_attempts,
                    digester: Digester::new(&c.cutover.diff),
                    config: c.clone(),
                })
            })
            .collect();
        let mut by_key: HashMap<Bytes, Vec<Arc<Route>>> = HashMap::new();
        for route in &list {
            // A push onto one of the route's priority lists is the route's.
            for key in route.lists() {
                by_key.entry(key).or_default().push(Arc::clone(route));
            }
        }
        let mut by_set: HashMap<Bytes, Vec<SetOwner>> = HashMap::new();
        for route in &list {
            for set in
                structures::mirrored_sets(&route.format, &route.redis_key, &route.config.keys)
            {
                let key = Bytes::copy_from_slice(set.key.as_bytes());
                by_set
                    .entry(key)
                    .or_default()
                    .push((Arc::clone(route), set));
            }
        }
        let mut by_held: HashMap<Bytes, Vec<SetOwner>> = HashMap::new();
        for route in &list {
            let held = structures::of_route(&route.format, &route.redis_key, &route.config.keys)
                .into_iter()
                .filter(|s| s.is_held_hash());
            for set in held {
                let key = Bytes::copy_from_slice(set.key.as_bytes());
                by_held
                    .entry(key)
                    .or_default()
                    .push((Arc::clone(route), set));
            }
        }
        Routes {
            list: Arc::new(list),
            by_key: Arc::new(by_key),
            by_set: Arc::new(by_set),
            by_held: Arc::new(by_held),
            phases,
        }
    }

    /// A table whose phases start as each route's configured phase.
    pub fn from_config(configs: &[RouteConfig]) -> Routes {
        let phases = PhaseView::new(configs.iter().map(|c| (c.name.clone(), c.phase)));
        Routes::new(configs, phases)
    }

    /// The route of a Redis list key in database `db`, if it is routed. The
    /// same key in another database is another application's list.
    pub fn by_db_key(&self, db: i64, key: &[u8]) -> Option<&Arc<Route>> {
        self.by_key.get(key)?.iter().find(|r| r.db == db)
    }

    /// Whether `key` is routed in any database (a cheap first test).
    pub fn is_routed_key(&self, key: &[u8]) -> bool {
        self.by_key.contains_key(key)
    }

    /// Whether `key` is a framework's set whose additions the proxy mirrors
    /// for some route (a cheap first test; see `set_route`).
    pub fn is_mirrored_set(&self, key: &[u8]) -> bool {
        self.by_set.contains_key(key)
    }

    /// The route a member added to the set `key` in database `db` belongs
    /// to (Sidekiq's `schedule` and `retry` are shared by every queue: the
    /// member's `queue` says whose it is).
    pub fn set_route(&self, db: i64, key: &[u8], member: &[u8]) -> Option<&Arc<Route>> {
        self.by_set
            .get(key)?
            .iter()
            .find(|(route, set)| route.db == db && set.owns(member))
            .map(|(route, _)| route)
    }

    /// Whether `key` is a framework's hash of jobs a worker holds (kombu's
    /// `unacked`) in some database.
    pub fn is_held_hash(&self, key: &[u8]) -> bool {
        self.by_held.contains_key(key)
    }

    /// The route owning `member` of the mirrored set or held-job hash at
    /// `key` in database `db`, with the job the member holds (kombu's
    /// `unacked` entries wrap it).
    pub fn set_job(&self, db: i64, key: &[u8], member: &[u8]) -> Option<(&Arc<Route>, Vec<u8>)> {
        let (route, set) = self
            .by_set
            .get(key)
            .into_iter()
            .chain(self.by_held.get(key))
            .flatten()
            .find(|(route, set)| route.db == db && set.owns(member))?;
        Some((route, set.job_of(member)?))
    }

    /// The route with this name.
    pub fn by_name(&self, name: &str) -> Option<&Arc<Route>> {
        self.list.iter().find(|r| r.name == name)
    }

    /// The route whose queue this is.
    pub fn by_queue(&self, queue: &str) -> Option<&Arc<Route>> {
        self.list.iter().find(|r| r.queue == queue)
    }

    /// The route's phase right now.
    pub fn phase(&self, route: &Route) -> Phase {
        self.phases.get(&route.name)
    }

    /// The phase a job is produced in: the route's phase, except in a
    /// partial `postgres_only` (the gradual flip), where a key outside the
    /// flipped share is produced as in `shadow`.
    pub fn item_phase(&self, route: &Route, decoded: &Decoded) -> Phase {
        self.phases.for_key(&route.name, key_base(decoded))
    }

    /// [`Routes::item_phase`] under a phase and share read before.
    pub fn item_phase_in(state: (Phase, u8), decoded: &Decoded) -> Phase {
        key_phase(state.0, state.1, key_base(decoded))
    }

    /// The phase of a push command, decided by its first item (only a
    /// partial `postgres_only` needs the item decoded: a multi-item push goes
    /// one way as a whole, so the proxy can forward or answer it as one),
    /// and only when every process routing the route's pushes follows the
    /// phase change it is from ([`crate::model::following`]).
    pub fn followed_push_phase(&self, route: &Route, first: Option<&Bytes>) -> Option<Phase> {
        let (phase, percent) = self.phases.followed(&route.name)?;
        Some(match first {
            Some(item) if phase == Phase::PostgresOnly && percent < 100 => {
                let decoded = decode_bytes(&route.format, item.clone());
                key_phase(phase, percent, key_base(&decoded))
            }
            _ => phase,
        })
    }

    /// The route's phase and flipped share once every process routing its
    /// pushes follows the change they are from, waiting up to `most`;
    /// `None` if they still do not.
    pub async fn followed_state(
        &self,
        route: &Route,
        most: std::time::Duration,
    ) -> Option<(Phase, u8)> {
        let until = tokio::time::Instant::now() + most;
        loop {
            if let Some(state) = self.phases.followed(&route.name) {
                return Some(state);
            }
            if !self.phases.wait_followed(&route.name, until).await {
                return None;
            }
        }
    }

    /// The shared phase view (the cutover watch updates it).
    pub fn phases(&self) -> &PhaseView {
        &self.phases
    }

    /// Every route, in config order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.list.iter()
    }

    /// True when no route is configured.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// What a key's share in a gradual flip is decided by: the id, or the
/// content hash without its occurrence number (so every copy goes one way).
fn key_base(decoded: &Decoded) -> &str {
    match &decoded.key {
        KeySource::Id(id) => id.as_str(),
        KeySource::ContentHash(hash) => hash.as_str(),
    }
}
