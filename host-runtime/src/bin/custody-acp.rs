//! `custody-acp --url ws://127.0.0.1:PORT/ws?token=TOKEN --session SESSION`: the ACP
//! face of a running host on stdin/stdout, for an editor (or `acpx`) to start as its
//! agent. `CUSTODY_URL` and `CUSTODY_SESSION` stand in for the flags. See
//! `host_runtime::acp`.

fn main() -> std::process::ExitCode {
    let mut url = std::env::var("CUSTODY_URL").ok();
    let mut session = std::env::var("CUSTODY_SESSION").ok();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--url", Some(u)) => url = Some(u),
            ("--session", Some(s)) => session = Some(s),
            _ => {
                eprintln!("usage: custody-acp --url ws://HOST/ws?token=TOKEN --session SESSION");
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
    match runtime.block_on(host_runtime::acp::serve_stdio(&url, &session)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("custody-acp: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
