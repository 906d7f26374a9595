//! `redis+sentinel://[[user]:password@]host:port[,host:port…]/<master>[/<db>]`:
//! a Redis URL that names sentinels and a monitored master instead of a
//! server (parsed and checked at load; `redis::sentinel` follows it).

use crate::redact::redact_url;

/// A parsed `redis+sentinel://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `host:port` of each sentinel, asked in order.
    pub sentinels: Vec<String>,
    /// The monitored master's name (`sentinel monitor <name> …`).
    pub master: String,
    /// The database index on the master.
    pub db: i64,
    /// `user:password@` or `:password@` for the master (and the sentinels).
    pub userinfo: String,
}

/// Whether `url` names sentinels.
pub fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://")
}

impl SentinelUrl {
    /// Parses `redis+sentinel://[userinfo@]h:p[,h:p…]/master[/db]`; the
    /// error is one line without the password.
    pub fn parse(url: &str) -> std::result::Result<SentinelUrl, String> {
        let bad = |why: &str| format!("{:?}: {why}", redact_url(url));
        let rest = url
            .strip_prefix("redis+sentinel://")
            .ok_or_else(|| bad("must start with redis+sentinel://"))?;
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("names no master (redis+sentinel://host:26379/<master>)"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), authority),
        };
        let sentinels: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| match h.contains(':') {
                true => h.to_string(),
                false => format!("{h}:26379"),
            })
            .collect();
        if sentinels.is_empty() {
            return Err(bad("names no sentinel"));
        }
        let mut parts = path.trim_end_matches('/').splitn(2, '/');
        let master = parts.next().unwrap_or_default().to_string();
        if master.is_empty() {
            return Err(bad(
                "names no master (redis+sentinel://host:26379/<master>)",
            ));
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(d) => d
                .parse()
                .map_err(|_| bad("the database after the master must be a number"))?,
        };
        Ok(SentinelUrl {
            sentinels,
            master,
            db,
            userinfo,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_urls() {
        let u = SentinelUrl::parse("redis+sentinel://:pw@a:26379,b:26380,c/mymaster/2").unwrap();
        assert_eq!(u.sentinels, vec!["a:26379", "b:26380", "c:26379"]);
        assert_eq!(u.master, "mymaster");
        assert_eq!(u.db, 2);
        assert_eq!(u.userinfo, ":pw@");
        let plain = SentinelUrl::parse("redis+sentinel://s1:26379/jobs").unwrap();
        assert_eq!((plain.db, plain.userinfo.as_str()), (0, ""));
    }

    #[test]
    fn bad_sentinel_urls_are_one_line_errors_without_the_password() {
        for bad in [
            "redis+sentinel://:s3cret@a:26379",
            "redis+sentinel://:s3cret@a:26379/",
            "redis+sentinel://:s3cret@a:26379/m/x",
        ] {
            let err = SentinelUrl::parse(bad).unwrap_err();
            assert!(!err.contains("s3cret"), "{err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
