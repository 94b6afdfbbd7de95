//! One `redis-server` a test owns: started on a free loopback port,
//! persistence off, its files in a temporary directory, killed when dropped;
//! optionally listening for TLS with certificates from a private CA.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::free_port;

const INSTALL: &str = "redis-server was not found on PATH: the Redis tests start real Redis servers. \
Install them with `sudo apt-get install redis-server redis-tools` (Debian/Ubuntu) and run the tests again.";

/// A `redis-server` process owned by a test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// A program `redis-server` runs under (with its arguments), if any.
    wrapper: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server on a free loopback port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port(extra.contains(&"--cluster-enabled"));
        RedisServer::start_on(port, extra)
    }

    /// Starts a server that also listens for TLS (on [`tls_port`]), with a
    /// certificate for 127.0.0.1 signed by a fresh private CA
    /// ([`ca_pem`](Self::ca_pem)). The plain port stays open for assertions.
    ///
    /// [`tls_port`]: Self::tls_port
    pub fn start_tls() -> RedisServer {
        RedisServer::start_tls_on(free_port(false), &certificates(), &[])
    }

    /// Starts a server on `port` that also listens for TLS on a free port,
    /// with the given CA, certificate and key (PEM), and `extra` arguments.
    pub(crate) fn start_tls_on(
        port: u16,
        (ca, cert, key): &(String, String, String),
        extra: &[&str],
    ) -> RedisServer {
        // With `tls-cluster yes` the cluster bus listens on the TLS port
        // plus 10000: that one must be free too. `port` is not bound yet,
        // so the probe could find it again: not that one, nor its bus.
        let tls_port = std::iter::repeat_with(|| free_port(true))
            .take(100)
            .find(|&p| p != port && p != port + 10_000 && p + 10_000 != port)
            .expect("a free port other than the plain one");
        let dir = server_dir(port);
        for (name, pem) in [("ca.pem", ca), ("server.pem", cert), ("server.key", key)] {
            std::fs::write(dir.join(name), pem).expect("write a certificate");
        }
        let path = |name: &str| dir.join(name).display().to_string();
        let mut args = vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.pem"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.pem"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: args,
            wrapper: Vec::new(),
        };
        server.launch();
        server
    }

    /// The TLS port of a server from [`start_tls`](Self::start_tls).
    pub fn tls_port(&self) -> u16 {
        let at = self
            .extra
            .iter()
            .position(|a| a == "--tls-port")
            .expect("a TLS server");
        self.extra[at + 1].parse().expect("a port")
    }

    /// The CA certificate (PEM) that signed a TLS server's certificate.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.pem")).expect("a TLS server")
    }

    /// Starts a server on `port`.
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        let dir = server_dir(port);
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            wrapper: Vec::new(),
        };
        server.launch();
        server
    }

    /// Starts a standalone server run under `wrapper` (a program and its
    /// arguments, `redis-server` and its own following), e.g. valgrind to
    /// count the instructions a command costs. Slow programs get 60 s to
    /// answer.
    pub fn start_under(wrapper: &[&str]) -> RedisServer {
        let port = free_port(false);
        let mut server = RedisServer {
            child: None,
            port,
            dir: server_dir(port),
            extra: Vec::new(),
            wrapper: wrapper.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let log =
            std::fs::File::create(self.dir.join("redis.log")).expect("create the server's log");
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg("redis-server");
                command
            }
            None => Command::new("redis-server"),
        };
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::from(log.try_clone().expect("log handle")))
            .stderr(Stdio::from(log))
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.wrapper.is_empty() => {
                panic!("cannot start {}: {e} (is it installed?)", self.wrapper[0])
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL}"),
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let patience = if self.wrapper.is_empty() { 15 } else { 60 };
        let deadline = Instant::now() + Duration::from_secs(patience);
        loop {
            if let Ok(mut conn) = self
                .client()
                .get_connection_with_timeout(Duration::from_millis(200))
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "redis-server on port {} exited with {status}:\n{}",
                    self.port,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server process runs (it is not between
    /// [`stop`](Self::stop) and [`restart`](Self::restart)).
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// What the server has logged so far (empty if the log cannot be read).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The URL of a user that may run scripts but not functions (as on
    /// Redis 6, where FCALL is an unknown command): made on first use.
    pub fn scripts_only_url(&self) -> String {
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "scripts",
                "on",
                ">pw",
                "~*",
                "&*",
                "+@all",
                "-fcall",
                "-function",
            ])
            .query(&mut self.connection())
            .expect("ACL SETUSER on the test server");
        format!("redis://scripts:pw@127.0.0.1:{}", self.port)
    }

    /// The server process id (for `SIGSTOP`/`SIGCONT` in chaos tests; under
    /// a wrapper, the wrapper's, which runs the server).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// A client for assertions.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid URL")
    }

    /// A synchronous connection for assertions.
    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection()
            .expect("connect to the test server")
    }

    /// Kills the server (its data is lost: persistence is off).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Sends a signal to the server process (`STOP`, `CONT`, ...); after
    /// `STOP`, returns once it has stopped ([`crate::signal()`]).
    pub fn signal(&self, signal: &str) {
        crate::signal(self.pid(), signal);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // A stopped process must be continued before it can die cleanly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server_dir(port: u16) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-redis-{}-{}-{port}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    dir
}

/// A private CA, and a certificate and key for 127.0.0.1 it signed (PEM).
pub(crate) fn certificates() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    // Distinct names: OpenSSL (which Redis uses between cluster nodes)
    // takes a certificate whose subject is its issuer's for self-signed.
    let name = |common: &str| {
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common);
        name
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.distinguished_name = name("sluice test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("parameters");
    params.distinguished_name = name("127.0.0.1");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}
