//! A small W3C WebDriver client over reqwest: enough to drive Debian's
//! chromium through chromedriver (headless) from the test suite — open a
//! page, fill and submit forms, read text, take a screenshot.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};

use crate::servers::free_port;

/// chromedriver and one headless Chromium session.
pub struct Browser {
    driver: tokio::process::Child,
    base: String,
    client: reqwest::Client,
}

/// Panics with what to install unless chromium and chromedriver are here:
/// these tests exist to run in a real browser.
fn require(program: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{program} is not installed: ./scripts/test-deps.sh installs Debian's chromium and chromium-driver"
    );
}

impl Browser {
    pub async fn start() -> Browser {
        require("chromium");
        require("chromedriver");
        let port = free_port();
        let driver = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let client = reqwest::Client::new();
        let root = format!("http://127.0.0.1:{port}");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,900"]
            }
        }}});
        let mut session = None;
        for _ in 0..100 {
            if let Ok(resp) = client
                .post(format!("{root}/session"))
                .json(&caps)
                .send()
                .await
            {
                let v: Value = resp.json().await.expect("a WebDriver answer");
                session = Some(
                    v["value"]["sessionId"]
                        .as_str()
                        .unwrap_or_else(|| panic!("no session: {v}"))
                        .to_string(),
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let session = session.expect("chromedriver answers within 10 s");
        Browser {
            driver,
            base: format!("{root}/session/{session}"),
            client,
        }
    }

    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        self.try_call(method, path, body)
            .await
            .unwrap_or_else(|error| panic!("WebDriver {method} {path}: {error}"))
    }

    /// One WebDriver call; the error object when the driver answers with one.
    async fn try_call(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let url = format!("{}{path}", self.base);
        let req = match method {
            "GET" => self.client.get(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.post(url).json(&body),
        };
        let v: Value = req
            .send()
            .await
            .expect("WebDriver call")
            .json()
            .await
            .expect("JSON");
        if v["value"].get("error").is_some() {
            return Err(v["value"].clone());
        }
        Ok(v["value"].clone())
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", "/url", json!({ "url": url })).await;
    }

    async fn element(&self, css: &str) -> String {
        let v = self
            .call(
                "POST",
                "/element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no element {css}"))
            .to_string()
    }

    /// Types `text` into the element matching `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.element(css).await;
        self.call("POST", &format!("/element/{id}/clear"), json!({}))
            .await;
        self.call(
            "POST",
            &format!("/element/{id}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    pub async fn click(&self, css: &str) {
        let id = self.element(css).await;
        self.call("POST", &format!("/element/{id}/click"), json!({}))
            .await;
    }

    /// Clicks what submits a form and waits for the next page to load (a
    /// click returns before the navigation it starts has finished).
    pub async fn submit(&self, css: &str) {
        self.run("window.__qbOld = true; return null").await;
        self.click(css).await;
        for _ in 0..200 {
            let fresh = self
                .run("return window.__qbOld === undefined && document.readyState === 'complete'")
                .await;
            if fresh == json!(true) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no new page within 5 s after clicking {css}");
    }

    /// The visible text of the element matching `css`. The console's live
    /// refresh replaces elements in place, so one found a moment ago can be
    /// gone ("stale element reference"): it is then looked up again.
    pub async fn text(&self, css: &str) -> String {
        for _ in 0..5 {
            let id = self.element(css).await;
            match self
                .try_call("GET", &format!("/element/{id}/text"), json!({}))
                .await
            {
                Ok(v) => return v.as_str().unwrap_or("").to_string(),
                Err(e) if e["error"] == "stale element reference" => continue,
                Err(e) => panic!("WebDriver GET /element/{id}/text: {e}"),
            }
        }
        panic!("the element {css} went stale five times in a row");
    }

    /// The page's HTML as the browser holds it.
    pub async fn source(&self) -> String {
        self.call("GET", "/source", json!({}))
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    pub async fn url(&self) -> String {
        self.call("GET", "/url", json!({}))
            .await
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Runs `script` in the page; its return value.
    pub async fn run(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            json!({ "script": script, "args": [] }),
        )
        .await
    }

    /// The page's cookies (HttpOnly ones too): (name, value).
    pub async fn cookies(&self) -> Vec<(String, String)> {
        self.call("GET", "/cookie", json!({}))
            .await
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
                        (s("name"), s("value"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let b64 = self.call("GET", "/screenshot", json!({})).await;
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or(""))
            .expect("a base64 PNG")
    }

    pub async fn quit(mut self) {
        let _ = self.client.delete(&self.base).send().await;
        let _ = self.driver.kill().await;
    }
}
