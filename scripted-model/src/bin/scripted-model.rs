//! `scripted-model [--for SECONDS]`: serves the scripted model API on a free loopback
//! port, prints `PORT <n>` and the two base URLs, and stops after SECONDS (600 by
//! default).

use std::time::Duration;

fn main() -> std::io::Result<()> {
    let mut seconds = 600u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--for", Some(s)) => match s.parse() {
                Ok(n) => seconds = n,
                Err(_) => {
                    eprintln!("--for takes a number of seconds, not {s:?}");
                    std::process::exit(2);
                }
            },
            _ => {
                eprintln!("usage: scripted-model [--for SECONDS]");
                std::process::exit(2);
            }
        }
    }
    let server = scripted_model::ModelServer::start()?;
    println!("PORT {}", server.port());
    println!("OPENAI_BASE_URL {}", server.openai_base_url());
    println!("ANTHROPIC_BASE_URL {}", server.anthropic_base_url());
    std::thread::sleep(Duration::from_secs(seconds));
    Ok(())
}
