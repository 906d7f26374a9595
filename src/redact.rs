//! Password redaction for connection URLs, so logs and error messages never
//! carry a secret: the password of the user info, and the `password` and
//! `sslpassword` query parameters libpq also accepts.

/// Query parameters whose values are secrets.
const SECRET_PARAMS: [&str; 2] = ["password", "sslpassword"];

/// Returns `url` with any password replaced by `***`. Strings that are not URLs
/// are returned unchanged.
pub fn redact_url(url: &str) -> String {
    let out = match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // set_password only fails for URLs that cannot have one.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_string(),
        // Unparseable (a bad port, say) but it may still hold a password:
        // blank whatever sits between the user's ':' and the last '@'.
        Err(_) => redact_unparsed(url),
    };
    redact_query(&out)
}

fn redact_unparsed(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    // Only '/' ends the authority here: a password may hold an unencoded '?'
    // or '#', and blanking too much is safer than showing a secret.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    match authority[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &authority[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

/// Replaces the value of every secret query parameter with `***`, working on
/// the text so it also covers URLs that do not parse, and leaves every other
/// byte as it was. Names are compared percent-decoded and case-insensitively.
fn redact_query(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_string();
    };
    let end = url[q..].find('#').map_or(url.len(), |i| q + i);
    let query = &url[q + 1..end];
    let mut changed = false;
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| {
            let name = pair.split('=').next().unwrap_or("");
            let decoded: String = url::form_urlencoded::parse(name.as_bytes())
                .map(|(k, _)| k.into_owned())
                .collect();
            if SECRET_PARAMS
                .iter()
                .any(|s| decoded.eq_ignore_ascii_case(s))
            {
                changed = true;
                format!("{name}=***")
            } else {
                pair.to_string()
            }
        })
        .collect();
    if !changed {
        return url.to_string();
    }
    format!("{}?{}{}", &url[..q], pairs.join("&"), &url[end..])
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn hides_password() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
    }

    #[test]
    fn leaves_urls_without_password() {
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(
            redact_url("postgres://app@db/x?sslmode=require&application_name=q%20b"),
            "postgres://app@db/x?sslmode=require&application_name=q%20b"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn hides_password_of_unparseable_url() {
        let out = redact_url("postgres://app:s3cr@t@db:99999/x");
        assert!(!out.contains("s3cr"), "{out}");
        assert_eq!(out, "postgres://app:***@db:99999/x");
    }

    #[test]
    fn hides_password_query_parameters() {
        assert_eq!(
            redact_url("postgres://app@db/x?password=s3cret"),
            "postgres://app@db/x?password=***"
        );
        assert_eq!(
            redact_url("postgres://app@db/x?sslmode=verify-full&sslpassword=k3y&connect_timeout=5"),
            "postgres://app@db/x?sslmode=verify-full&sslpassword=***&connect_timeout=5"
        );
        // Both places at once, a spelled-out name, an empty value, a fragment.
        assert_eq!(
            redact_url(
                "postgres://app:s3cret@db/x?PassWord=s3cret&pass%77ord=s3cret&password#frag"
            ),
            "postgres://app:***@db/x?PassWord=***&pass%77ord=***&password=***#frag"
        );
    }

    #[test]
    fn hides_password_query_parameters_of_unparseable_url() {
        for (url, want) in [
            (
                "postgres://app@db:99999/x?password=s3cret",
                "postgres://app@db:99999/x?password=***",
            ),
            (
                "postgres://app@db:notaport?sslpassword=s3cret&sslmode=require",
                "postgres://app@db:notaport?sslpassword=***&sslmode=require",
            ),
            (
                "postgres://app:s3cret@db:99999?password=s3cret",
                "postgres://app:***@db:99999?password=***",
            ),
        ] {
            let out = redact_url(url);
            assert!(!out.contains("s3cret"), "{out}");
            assert_eq!(out, want);
        }
    }
}
