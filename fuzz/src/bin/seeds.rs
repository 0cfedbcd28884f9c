//! Writes the seed corpora (`seeds CORPUS_DIR`: one directory per target, one file per
//! seed) or the fixture the signed-state target checks against (`seeds --fixtures DIR`;
//! the seeds are signed with it, so write the corpora again after).

use std::path::Path;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, dir] if flag == "--fixtures" => {
            let dir = Path::new(dir);
            std::fs::create_dir_all(dir)?;
            let files = domaind_fuzz::fixture::generate();
            std::fs::write(dir.join("ca.crt"), files.ca_pem)?;
            std::fs::write(dir.join("node-a.crt"), files.cert_pem)?;
            std::fs::write(dir.join("node-a.key"), files.key_pem)?;
        }
        [dir] => {
            for (target, _) in domaind_fuzz::TARGETS {
                let dir = Path::new(dir).join(target);
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)?;
                }
                std::fs::create_dir_all(&dir)?;
                for (name, bytes) in domaind_fuzz::seeds::of(target) {
                    std::fs::write(dir.join(name), bytes)?;
                }
            }
        }
        _ => {
            eprintln!("usage: seeds CORPUS_DIR | seeds --fixtures DIR");
            std::process::exit(2);
        }
    }
    Ok(())
}
