//! The conversation page in headless Chromium, two pages at once (a phone and a
//! desktop): the server, the host and the client timeline of `timeline-core` compiled to
//! WebAssembly, driven through WebDriver (SV-04, WI-06, TL-03, TL-08).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`apt-get install chromium
//! chromium-driver`; or CHROMIUM and CHROMEDRIVER naming them) and the wasm target
//! (`rustup target add wasm32-unknown-unknown`): without them it fails saying so.
//! Screenshots go to `target/browser/`.
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod page;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use host_runtime::server::ServerConfig;
use serde_json::{json, Value};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn tool(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: install Chromium and its driver (apt-get install chromium \
         chromium-driver) or set {var}",
        path.display()
    );
    path
}

/// chromedriver, killed when dropped (a failed test leaves no driver behind).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        // Gone already is as good as killed.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts chromedriver on a free loopback port.
async fn chromedriver() -> (Driver, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Driver(
        Command::new(tool("CHROMEDRIVER", "/usr/bin/chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts"),
    );
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return (child, port);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("chromedriver did not listen within 5 s");
}

async fn browser(port: u16, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": tool("CHROMIUM", "/usr/bin/chromium"),
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=900,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session")
}

/// The rows a page shows: key, origin, text.
async fn rows(page: &Client) -> Vec<(String, String, String)> {
    let v = page
        .execute(
            "return Array.from(document.querySelectorAll('#timeline .row')).map(r => [r.dataset.key, r.dataset.origin, r.textContent]);",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

async fn eventually<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..300 {
        if done().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen within 15 s");
}

async fn shot(page: &Client, name: &str) {
    let dir = workspace().join("target").join("browser");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.png")),
        page.screenshot().await.unwrap(),
    )
    .unwrap();
}

async fn send(page: &Client, text: &str) {
    page.find(Locator::Id("text"))
        .await
        .unwrap()
        .send_keys(text)
        .await
        .unwrap();
    page.find(Locator::Id("send"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

fn no_duplicate_keys(rows: &[(String, String, String)]) -> bool {
    let keys: std::collections::BTreeSet<&String> = rows.iter().map(|r| &r.0).collect();
    keys.len() == rows.len()
}

fn count_text(rows: &[(String, String, String)], text: &str) -> usize {
    rows.iter().filter(|r| r.2 == text).count()
}

// SV-04, WI-06, TL-03, TL-08: two pages, one conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pages_show_one_conversation() {
    let wasm = scripted_model::wasm::timeline_wasm().unwrap_or_else(|e| panic!("{e}"));
    let (runtime, server, sends) = page::serve(ServerConfig::default().page(wasm), 30).await;
    let addr = server.local_addr();
    let (driver, port) = chromedriver().await;
    let profiles = std::env::temp_dir().join(format!("custody-browser-{}", std::process::id()));
    let phone = browser(port, &profiles.join("phone")).await;
    let desk = browser(port, &profiles.join("desk")).await;

    // The phone pairs through the page; the desktop comes with its token.
    phone
        .goto(&format!("http://{addr}/?session=s1"))
        .await
        .unwrap();
    let code = server.pairing_code().unwrap();
    phone
        .wait()
        .for_element(Locator::Id("code"))
        .await
        .unwrap()
        .send_keys(&code)
        .await
        .unwrap();
    phone
        .find(Locator::Css("#pairing button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let token = page::pair(&server, "desktop").await;
    desk.goto(&format!("http://{addr}/?session=s1&token={token}"))
        .await
        .unwrap();
    for p in [&phone, &desk] {
        eventually("the first window", || async { rows(p).await.len() == 12 }).await;
    }
    shot(&phone, "1-opened").await;

    // A send shows at once (its echo), then its row, once, on both pages.
    send(&phone, "hello").await;
    let first = rows(&phone).await;
    assert_eq!(
        count_text(&first, "hello"),
        1,
        "the echo at once: {first:?}"
    );
    for p in [&phone, &desk] {
        eventually("the reply", || async {
            let r = rows(p).await;
            count_text(&r, "echo: hello") == 1
                && r.iter().any(|row| row.2 == "hello" && row.1 == "live")
        })
        .await;
        let r = rows(p).await;
        assert_eq!(count_text(&r, "hello"), 1, "{r:?}");
        assert!(no_duplicate_keys(&r));
    }
    assert_eq!(sends.load(std::sync::atomic::Ordering::SeqCst), 1);
    shot(&desk, "2-sent").await;

    // An approval decided on the desktop shows decided on both; the phone's decision
    // then is refused as already resolved.
    send(&phone, "approve npm test").await;
    let pending = r#"[data-approval="pending"] button[data-decision="accept"]"#;
    for p in [&phone, &desk] {
        p.wait().for_element(Locator::Css(pending)).await.unwrap();
    }
    shot(&phone, "3-approval").await;
    desk.find(Locator::Css(pending))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for p in [&phone, &desk] {
        p.wait()
            .for_element(Locator::Css(r#"[data-approval="accepted"]"#))
            .await
            .unwrap();
    }
    let card = phone
        .execute(
            "const row = document.querySelector('[data-approval=\"accepted\"]'); return row.dataset.key;",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        card.as_str().unwrap().starts_with("activity:approval:"),
        "{card}"
    );
    let refused = phone
        .execute_async(
            "const [done] = arguments; custody.decide('accepted', 'decline').then(done);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        refused["errorCode"], "APPROVAL_ALREADY_RESOLVED",
        "{refused}"
    );
    let notice = phone
        .find(Locator::Id("notice"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        notice,
        "This request was already decided on another device."
    );
    shot(&desk, "4-decided").await;

    // The phone's socket is cut while a reply streams: it comes back through its replay
    // and a reload, with no duplicate and no gap.
    send(&desk, "slow one").await;
    eventually("the stream started", || async {
        rows(&phone).await.iter().any(|r| r.2.starts_with("word0"))
    })
    .await;
    phone.execute("custody.cut();", vec![]).await.unwrap();
    // Older pages load on the desktop while the reply streams.
    desk.find(Locator::Id("older"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for p in [&phone, &desk] {
        eventually("the stream ended", || async {
            rows(p).await.iter().any(|r| r.2.ends_with("word39"))
        })
        .await;
    }
    let (a, b) = (rows(&phone).await, rows(&desk).await);
    assert!(no_duplicate_keys(&a) && no_duplicate_keys(&b));
    // RB-03, RB-04: the phone rebuilt the session's record from the replay of its first
    // join and of its join after the cut; the message sent while it streamed is in it
    // once.
    let record = phone
        .execute("return custody.record();", vec![])
        .await
        .unwrap();
    assert!(record["replays"].as_u64().unwrap() >= 2, "{record}");
    let said: Vec<&Value> = record["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "user" && r["text"] == "slow one")
        .collect();
    assert_eq!(said.len(), 1, "{record}");
    assert!(
        b.len() > a.len(),
        "the desktop paged back: {} rows, phone {}",
        b.len(),
        a.len()
    );
    // The phone's rows are the desktop's newest, in the same order: no gap.
    let tail: Vec<&String> = b.iter().rev().take(a.len()).rev().map(|r| &r.0).collect();
    let phone_keys: Vec<&String> = a.iter().map(|r| &r.0).collect();
    assert_eq!(phone_keys, tail);
    shot(&phone, "5-after-cut").await;
    shot(&desk, "6-paged").await;

    // The language-neutral vectors give the same rows in the browser's wasm build.
    let dir = workspace().join("timeline-wasm").join("vectors");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(!names.is_empty());
    for path in names {
        let vector: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let got = phone
            .execute_async(
                "const [vector, done] = arguments; custody.replay(vector).then(done);",
                vec![vector.clone()],
            )
            .await
            .unwrap();
        let expected: Vec<Value> = vector["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| json!([s["rows"], s["changes"]]))
            .collect();
        assert_eq!(got, Value::Array(expected), "{}", path.display());
    }

    phone.close().await.unwrap();
    desk.close().await.unwrap();
    drop(driver);
    server.shutdown().await.unwrap();
    runtime.shutdown().await.unwrap();
    std::fs::remove_dir_all(&profiles).ok();
}
