//! What two readings of Redis a moment apart agree is missing.
//!
//! Redis is read list by list, and the consumer records an outcome a
//! moment after it acts: an item moving between lists, or just finished,
//! can look unaccounted for in one reading. So repair considers only what a
//! second reading still misses.
//!
//! By key for ids and for copies whose number a pop took (a key names one
//! job). Not for copies of a text no pop has taken yet: those are named by
//! count — the oldest numbers no pop took — and the pops between the two
//! readings take those numbers, so under load two readings name different
//! keys for the same lost copy and agree on none (the oracle campaign lost
//! a copy that way in seeds 3100, 3166, 3194, 3208, 3568, 3672, 3766). For
//! them the readings agree per text, on a count: as many as both readings
//! miss, named as the second reading names them.
//!
//! While consumers pop, a reading can also count a copy short: an item
//! popped while Redis is read is both in a list and counted as popped, which
//! hides one loss of its text in that reading (read in the other order, it
//! would invent one). Two readings then disagree, and the loss would be left
//! for a next repair that may never come (oracle seed 120298: the last
//! repair before a decommission ran while the consumers drained a backlog).
//! So [`Rereads`] reads again, up to [`MOST_READINGS`], while the latest
//! reading was taken while copies moved (`RedisView::moved_while_read`) or
//! the latest two disagree in either direction; what the last two still
//! disagree on is reported as not judged, and a last reading taken while
//! copies moved is reported too: either way, never taken as found.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::redis::consumer::numbering;

/// One reading: each key Redis does not account for, with whether a pop
/// had taken its number (`ONLY_POSTGRES_SQL`).
pub type Reading = HashMap<String, bool>;

/// Most readings of Redis one repair takes while they keep disagreeing.
pub const MOST_READINGS: usize = 5;

/// Readings a moment apart, until the latest two agree on everything
/// either misses and the latest was taken while nothing moved.
pub struct Rereads {
    previous: Option<Reading>,
    latest: Reading,
    /// The latest reading was taken while copies moved.
    moved: bool,
    taken: usize,
}

/// What the latest two readings agree is missing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Agreed {
    /// Sorted.
    pub keys: Vec<String>,
    /// Those a pop had taken the number of (see [`agreed`]).
    pub popped: HashSet<String>,
    /// Copies either of the last two readings misses that the two do not
    /// agree on: not judged (Redis changed between the readings).
    pub not_judged: usize,
    /// The last reading was taken while copies were pushed or popped, so
    /// it may have hidden a loss: the repair should be run again.
    pub moved: bool,
}

impl Rereads {
    /// The first reading, and whether copies moved while it was taken.
    pub fn new(first: Reading, moved: bool) -> Rereads {
        Rereads {
            previous: None,
            latest: first,
            moved,
            taken: 1,
        }
    }

    /// Whether to read again (fewer than [`MOST_READINGS`] taken): the
    /// latest reading was taken while copies moved, or it misses something
    /// and is the only one, or the latest two disagree.
    pub fn wants_another(&self) -> bool {
        if self.taken >= MOST_READINGS {
            return false;
        }
        match &self.previous {
            _ if self.moved => true,
            None => !self.latest.is_empty(),
            Some(previous) => !agree(previous, &self.latest),
        }
    }

    pub fn add(&mut self, reading: Reading, moved: bool) {
        self.previous = Some(std::mem::replace(&mut self.latest, reading));
        self.moved = moved;
        self.taken += 1;
    }

    pub fn finish(self) -> Agreed {
        let Some(previous) = self.previous else {
            // One reading alone proves nothing.
            return Agreed {
                not_judged: self.latest.len(),
                moved: self.moved,
                ..Agreed::default()
            };
        };
        let (keys, popped) = agreed(&previous, &self.latest);
        Agreed {
            not_judged: previous.len().max(self.latest.len()) - keys.len(),
            keys,
            popped,
            moved: self.moved,
        }
    }
}

/// The two readings miss the same copies: every key either misses is agreed
/// on (copies no pop took by count per text, see [`agreed`]).
fn agree(first: &Reading, second: &Reading) -> bool {
    let both = agreed(first, second).0.len();
    both == first.len() && both == second.len()
}

/// What both readings miss, sorted, and which of those were popped
/// (according to the second reading).
pub fn agreed(first: &Reading, second: &Reading) -> (Vec<String>, HashSet<String>) {
    let fresh = |key: &str, popped: bool| !popped && numbering::numbered(key).is_some();
    let mut keys: Vec<String> = second
        .iter()
        // Same key, same class: a number counted short in the first reading
        // and popped in the second names a pop in flight, not a loss.
        .filter(|(k, popped)| !fresh(k, **popped) && first.get(*k) == Some(*popped))
        .map(|(k, _)| k.clone())
        .collect();
    // Per text: the first reading's count of copies no pop had taken, less
    // those the second found popped (matched by key above).
    let mut first_fresh: HashMap<&str, usize> = HashMap::new();
    for (key, popped) in first {
        if fresh(key, *popped) && second.get(key).is_none_or(|p| !*p) {
            let (text, _) = numbering::numbered(key).expect("fresh keys are numbered");
            *first_fresh.entry(text).or_default() += 1;
        }
    }
    let mut second_fresh: BTreeMap<&str, Vec<(i64, &String)>> = BTreeMap::new();
    for (key, popped) in second {
        if fresh(key, *popped) {
            let (text, n) = numbering::numbered(key).expect("fresh keys are numbered");
            second_fresh.entry(text).or_default().push((n, key));
        }
    }
    for (text, mut named) in second_fresh {
        named.sort();
        let both = named.len().min(first_fresh.get(text).copied().unwrap_or(0));
        keys.extend(named.into_iter().take(both).map(|(_, k)| k.clone()));
    }
    keys.sort();
    let popped = keys
        .iter()
        .filter(|k| second.get(*k).copied().unwrap_or(false))
        .cloned()
        .collect();
    (keys, popped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(keys: &[(&str, bool)]) -> Reading {
        keys.iter().map(|(k, p)| (k.to_string(), *p)).collect()
    }

    #[test]
    fn ids_and_popped_copies_must_be_missed_by_both_readings_by_key() {
        let first = reading(&[("job-1", false), ("job-2", false), ("sha256:aa:3", true)]);
        let second = reading(&[("job-2", false), ("sha256:aa:3", true), ("job-9", false)]);
        let (keys, popped) = agreed(&first, &second);
        assert_eq!(keys, ["job-2", "sha256:aa:3"]);
        assert_eq!(popped, HashSet::from(["sha256:aa:3".to_string()]));
    }

    #[test]
    fn copies_no_pop_took_agree_per_text_by_count_named_by_the_second_reading() {
        // Pops between the readings took numbers 7 and 8: the one copy both
        // readings miss is named 9 in the second.
        let first = reading(&[("sha256:aa:7", false), ("sha256:bb:2", false)]);
        let second = reading(&[("sha256:aa:9", false), ("sha256:aa:10", false)]);
        let (keys, popped) = agreed(&first, &second);
        assert_eq!(keys, ["sha256:aa:9"]);
        assert!(popped.is_empty());
    }

    #[test]
    fn a_reading_that_hid_a_loss_is_outvoted_by_two_that_agree_on_it() {
        // Seed 120298: the first reading ran while consumers popped and
        // counted the lost copy's text one short; the next two, quiet, both
        // miss copy 58.
        let busy = reading(&[("job-7", false)]);
        let quiet = || reading(&[("sha256:ec:58", false)]);
        let mut r = Rereads::new(busy, true);
        let mut readings = vec![quiet(), quiet()].into_iter();
        while r.wants_another() {
            r.add(
                readings.next().expect("at most three readings needed"),
                false,
            );
        }
        let agreed = r.finish();
        assert_eq!(agreed.keys, ["sha256:ec:58"]);
        assert_eq!((agreed.not_judged, agreed.moved), (0, false));
    }

    #[test]
    fn a_loss_hidden_in_the_latest_reading_is_read_again_not_dropped() {
        // The reverse order: quiet first, then a reading taken while pops
        // went on that hides copy 58 (it misses nothing), then quiet again.
        let quiet = || reading(&[("sha256:ec:58", false)]);
        let mut r = Rereads::new(quiet(), false);
        let mut readings =
            vec![(Reading::new(), true), (quiet(), false), (quiet(), false)].into_iter();
        while r.wants_another() {
            let (next, moved) = readings.next().expect("at most four readings needed");
            r.add(next, moved);
        }
        assert_eq!(r.finish().keys, ["sha256:ec:58"]);
    }

    #[test]
    fn an_empty_first_reading_taken_while_copies_moved_is_read_again() {
        let mut r = Rereads::new(Reading::new(), true);
        assert!(r.wants_another());
        r.add(reading(&[("sha256:ec:58", false)]), false);
        assert!(r.wants_another());
        r.add(reading(&[("sha256:ec:58", false)]), false);
        assert!(!r.wants_another());
        assert_eq!(r.finish().keys, ["sha256:ec:58"]);
    }

    #[test]
    fn readings_that_keep_moving_are_reported_as_such() {
        let mut r = Rereads::new(reading(&[("job-1", false)]), true);
        while r.wants_another() {
            r.add(reading(&[("job-1", false)]), true);
        }
        let agreed = r.finish();
        // Ids are judged by key: both readings miss job-1.
        assert_eq!(agreed.keys, ["job-1"]);
        assert!(agreed.moved);
    }

    #[test]
    fn readings_that_never_agree_stop_and_leave_the_rest_not_judged() {
        let mut r = Rereads::new(reading(&[("job-1", false)]), false);
        let mut n = 1;
        while r.wants_another() {
            n += 1;
            r.add(reading(&[(format!("job-{n}").as_str(), false)]), false);
        }
        assert_eq!(n, MOST_READINGS);
        let agreed = r.finish();
        assert!(agreed.keys.is_empty());
        assert_eq!(agreed.not_judged, 1);
    }

    #[test]
    fn an_empty_first_reading_needs_no_second() {
        let r = Rereads::new(Reading::new(), false);
        assert!(!r.wants_another());
        assert_eq!(r.finish(), Agreed::default());
    }

    #[test]
    fn a_number_popped_between_the_readings_is_left_for_the_next_repair() {
        // 5 was short in the first reading and a pop's in the second: a pop
        // in flight (numbered, its key not yet in its inflight hash) looks
        // like that, so it is neither matched nor counted.
        let first = reading(&[("sha256:aa:5", false), ("sha256:aa:6", false)]);
        let second = reading(&[("sha256:aa:5", true), ("sha256:aa:7", false)]);
        let (keys, popped) = agreed(&first, &second);
        assert_eq!(keys, ["sha256:aa:7"]);
        assert!(popped.is_empty());
    }
}
