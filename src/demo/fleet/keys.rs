//! The fleet drill with a framework's key options changed from their
//! defaults, as teams run them (`--key-prefix`, `--priority-steps`): the
//! fleet's application is started with them (kombu's transport options
//! `global_keyprefix` and `priority_steps`, RQ 3's `RQ_KEY_PREFIX`), and the
//! route states the same (`key_prefix`, `priority_steps`), so the drill
//! shows the route finds the fleet's keys where the framework puts them.

use tokio::process::Command;

use super::Framework;
use crate::error::{Error, Result};

/// The fleet's key options; both `None`: the frameworks' defaults.
#[derive(Debug, Clone, Default)]
pub struct FleetKeys {
    /// kombu's `global_keyprefix` (Celery) or `RQ_KEY_PREFIX` (RQ).
    pub key_prefix: Option<String>,
    /// kombu's `priority_steps` (Celery); tasks are then sent with
    /// priorities 0 to 9.
    pub priority_steps: Option<Vec<u8>>,
}

impl FleetKeys {
    /// Refuses options the drill's framework has no counterpart of.
    pub fn check(&self, framework: Option<Framework>) -> Result<()> {
        let refuse = |what: &str| Err(Error::InvalidInput(what.to_string()));
        match framework {
            None if self.key_prefix.is_some() || self.priority_steps.is_some() => {
                refuse("--key-prefix and --priority-steps need --framework celery or rq")
            }
            Some(Framework::Sidekiq) if self.key_prefix.is_some() || self.priority_steps.is_some() => {
                refuse("--key-prefix and --priority-steps are Celery's and RQ's options, not Sidekiq's")
            }
            Some(Framework::Rq) if self.priority_steps.is_some() => {
                refuse("--priority-steps is kombu's option: it needs --framework celery")
            }
            _ if self.key_prefix.as_deref() == Some("") => refuse("--key-prefix is empty"),
            _ => Ok(()),
        }
    }

    /// The route's Redis key for the framework's queue `queue`: the list the
    /// framework pushes to under these options.
    pub(super) fn redis_key(&self, fw: Framework, queue: &str) -> String {
        match (fw, self.key_prefix.as_deref()) {
            (Framework::Celery, Some(prefix)) => format!("{prefix}{queue}"),
            (Framework::Rq, Some(prefix)) => format!("{prefix}:queue:{queue}"),
            _ => fw.route_key(queue).0,
        }
    }

    /// The route's lines that state these options.
    pub(super) fn route_lines(&self) -> String {
        let mut lines = String::new();
        if let Some(prefix) = &self.key_prefix {
            lines.push_str(&format!("key_prefix = {prefix:?}\n"));
        }
        if let Some(steps) = &self.priority_steps {
            let steps: Vec<String> = steps.iter().map(u8::to_string).collect();
            lines.push_str(&format!("priority_steps = [{}]\n", steps.join(", ")));
        }
        lines
    }

    /// The fleet's environment for these options: the Celery application
    /// reads `KEY_PREFIX` and `PRIORITY_STEPS` (`examples/fleets/celery_app.py`);
    /// RQ reads `RQ_KEY_PREFIX` itself.
    pub(super) fn environment(&self, fw: Framework, cmd: &mut Command) {
        if let Some(prefix) = &self.key_prefix {
            cmd.env(
                if fw == Framework::Rq {
                    "RQ_KEY_PREFIX"
                } else {
                    "KEY_PREFIX"
                },
                prefix,
            );
        }
        if let Some(steps) = &self.priority_steps {
            let steps: Vec<String> = steps.iter().map(u8::to_string).collect();
            cmd.env("PRIORITY_STEPS", steps.join(","));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_a_framework_lacks_are_refused_with_one_line() {
        let prefix = FleetKeys {
            key_prefix: Some("app1:".into()),
            priority_steps: None,
        };
        let steps = FleetKeys {
            key_prefix: None,
            priority_steps: Some(vec![0, 5, 9]),
        };
        for (keys, fw, expected) in [
            (&prefix, None, "need --framework"),
            (&prefix, Some(Framework::Sidekiq), "not Sidekiq's"),
            (&steps, Some(Framework::Rq), "needs --framework celery"),
        ] {
            let err = keys.check(fw).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
        assert!(prefix.check(Some(Framework::Celery)).is_ok());
        assert!(steps.check(Some(Framework::Celery)).is_ok());
    }

    #[test]
    fn the_route_names_the_list_the_framework_pushes_to() {
        let celery = FleetKeys {
            key_prefix: Some("app1:".into()),
            priority_steps: Some(vec![0, 5, 9]),
        };
        assert_eq!(celery.redis_key(Framework::Celery, "q"), "app1:q");
        assert_eq!(
            celery.route_lines(),
            "key_prefix = \"app1:\"\npriority_steps = [0, 5, 9]\n"
        );
        let rq = FleetKeys {
            key_prefix: Some("app1".into()),
            priority_steps: None,
        };
        assert_eq!(rq.redis_key(Framework::Rq, "q"), "app1:queue:q");
        assert_eq!(
            FleetKeys::default().redis_key(Framework::Rq, "q"),
            "rq:queue:q"
        );
    }
}
