//! Password redaction for connection URLs, so logs and error messages never
//! carry a secret.

/// Returns `url` with any password replaced by `***`. Strings that are not URLs
/// are returned unchanged.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // set_password only fails for URLs that cannot have one.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_string(),
        // Unparseable (a bad port, say) but it may still hold a password:
        // blank whatever sits between the user's ':' and the last '@'.
        Err(_) => redact_unparsed(url),
    }
}

fn redact_unparsed(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
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
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn hides_password_of_unparseable_url() {
        let out = redact_url("postgres://app:s3cr@t@db:99999/x");
        assert!(!out.contains("s3cr"), "{out}");
        assert_eq!(out, "postgres://app:***@db:99999/x");
    }
}
