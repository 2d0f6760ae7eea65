//! A real nginx (Debian's package; `scripts/test.sh` installs it with `ensure_nginx`) run
//! by a test as a process of its own: a config in a temporary directory, listening on a free
//! loopback port, logging there. A missing or failing nginx fails the test, saying why.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::poll::poll;

/// How long nginx gets to start listening.
const START: Duration = Duration::from_secs(15);

/// A running nginx; stopped when dropped.
pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// The loopback port it listens on.
    pub port: u16,
}

/// A free loopback port (another process may take it before nginx does; rare).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .unwrap_or_else(|| {
            panic!(
                "nginx is not installed: these tests run a real nginx. Run scripts/test.sh (its ensure_nginx \
                 installs Debian's package) or apt-get install -y nginx-light"
            )
        })
}

impl Nginx {
    /// Starts nginx with `config`, a complete `nginx.conf` whose `listen` directive is
    /// `LISTEN` (replaced by a free loopback address). Its temporary files, pid and logs go
    /// to a directory of its own.
    pub async fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for nginx");
        let root = dir.path().display().to_string();
        let port = free_port();
        write_config(dir.path(), port, config);
        let log = std::fs::File::create(dir.path().join("stderr.log")).expect("nginx stderr file");
        let child = Command::new(binary())
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-g")
            .arg(format!("daemon off; pid {root}/nginx.pid; user root;"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nginx");
        let mut nginx = Self { child, dir, port };
        nginx.wait_listening().await;
        nginx
    }

    async fn wait_listening(&mut self) {
        let Self { child, dir, port } = self;
        let listening = poll()
            .within(START)
            .every(Duration::from_millis(20))
            .try_until("nginx to listen", async || {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("nginx exited with {status} at start:\n{}", logs_in(dir.path()));
                }
                tokio::net::TcpStream::connect(("127.0.0.1", *port)).await.map(drop)
            })
            .await;
        if let Err(why) = listening {
            panic!("{why}:\n{}", self.logs());
        }
    }

    /// Replaces the config with `config` (its `listen LISTEN;` on the same port) and has
    /// nginx reload it (SIGHUP), as an operator's `nginx -s reload`: open connections stay
    /// where they are, new ones follow the new config once its workers are up.
    pub fn reload(&self, config: &str) {
        write_config(self.dir.path(), self.port, config);
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "SIGHUP to nginx failed:\n{}", self.logs());
    }

    /// nginx's error log and stderr, for failure messages.
    pub fn logs(&self) -> String {
        logs_in(self.dir.path())
    }
}

impl Drop for Nginx {
    /// Stops nginx as `nginx -s stop` does (SIGTERM to the master, which stops its
    /// workers); a SIGKILL would leave the workers running, listening, without a master.
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `config` as `dir`'s nginx.conf, listening on loopback `port`, its temporary
/// files in `dir`.
fn write_config(dir: &std::path::Path, port: u16, config: &str) {
    let root = dir.display();
    let temp_paths = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
        .iter()
        .map(|kind| format!("    {kind}_temp_path {root}/{kind};\n"))
        .collect::<String>();
    let config = config.replacen("listen LISTEN;", &format!("listen 127.0.0.1:{port};"), 1).replacen(
        "http {\n",
        &format!("http {{\n{temp_paths}    access_log off;\n"),
        1,
    );
    assert!(config.contains(&format!("127.0.0.1:{port}")), "the config has no `listen LISTEN;`:\n{config}");
    std::fs::write(dir.join("nginx.conf"), &config).expect("write nginx.conf");
}

/// The error log and stderr nginx wrote into `dir`.
fn logs_in(dir: &std::path::Path) -> String {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    format!("--- error.log\n{}--- stderr\n{}", read("error.log"), read("stderr.log"))
}
