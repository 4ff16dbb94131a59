//! `custody-acp --url ws://127.0.0.1:PORT/ws?token=TOKEN --session SESSION`: the ACP
//! face of a running host on stdin/stdout, for an editor (or `acpx`) to start as its
//! agent. `CUSTODY_URL` and `CUSTODY_SESSION` stand in for the flags. See
//! `host_runtime::acp`.
//!
//! A host over TLS (built with the feature `tls`): `--url wss://HOST:PORT/ws?token=TOKEN
//! --ca FILE`, where FILE holds the PEM certificates the server's must chain to (its own
//! self-signed one, or a CA bundle); `CUSTODY_CA` stands in for `--ca`.

fn main() -> std::process::ExitCode {
    let mut url = std::env::var("CUSTODY_URL").ok();
    let mut session = std::env::var("CUSTODY_SESSION").ok();
    let mut ca = std::env::var("CUSTODY_CA").ok();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--url", Some(u)) => url = Some(u),
            ("--session", Some(s)) => session = Some(s),
            ("--ca", Some(c)) => ca = Some(c),
            _ => {
                eprintln!(
                    "usage: custody-acp --url ws://HOST/ws?token=TOKEN --session SESSION [--ca FILE]"
                );
                return std::process::ExitCode::from(2);
            }
        }
    }
    let (Some(url), Some(session)) = (url, session) else {
        eprintln!("custody-acp needs --url (or CUSTODY_URL) and --session (or CUSTODY_SESSION)");
        return std::process::ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("custody-acp: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(&url, &session, ca.as_deref())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("custody-acp: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "tls")]
async fn serve(url: &str, session: &str, ca: Option<&str>) -> std::io::Result<()> {
    match (url.starts_with("wss://"), ca) {
        (false, _) => host_runtime::acp::serve_stdio(url, session).await,
        (true, Some(file)) => {
            let roots = std::fs::read(file)
                .map_err(|e| std::io::Error::new(e.kind(), format!("--ca {file}: {e}")))?;
            host_runtime::acp::serve_stdio_tls(url, session, &roots).await
        }
        (true, None) => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a wss:// URL needs --ca FILE: the PEM certificates the server's must chain to",
        )),
    }
}

#[cfg(not(feature = "tls"))]
async fn serve(url: &str, session: &str, ca: Option<&str>) -> std::io::Result<()> {
    if url.starts_with("wss://") || ca.is_some() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "wss:// needs custody-acp built with the feature tls",
        ));
    }
    host_runtime::acp::serve_stdio(url, session).await
}
