//! The external program of an `exec` node as a child process: JSON lines in on stdin, JSON lines
//! out on stdout, stderr kept as a tail for error messages.
//!
//! Each pipe has its own thread: requests are written by a writer thread (so a program that stops
//! reading cannot block flowrl on a full pipe: the read timeout still fires), stdout lines come
//! through a channel (so that a read can time out), and stderr is drained into a bounded tail (so
//! that a chatty program never blocks on a full pipe). Every stderr line also goes to the run's log
//! file once one is attached ([`Process::log_stderr_to`]); the lines written before that (the
//! program's start-up, before and around its handshake) are kept and written first.
//! Dropping a [`Process`] closes its stdin, gives it a short grace period to exit on end of input,
//! then kills it: a program never outlives its node.
//!
//! What this module does not do: it knows nothing of the protocol's messages (see `protocol`) or
//! of restarts (see the node in `mod.rs`).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How many lines of stderr are kept for error messages.
const STDERR_LINES: usize = 20;
/// At most this many bytes of stderr are kept for the log before a log file is attached.
const EARLY_STDERR_BYTES: usize = 1 << 20;
/// How long a program gets to exit by itself after its stdin is closed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Why talking to the program failed. All of these leave the conversation in an unknown state:
/// the process is unusable afterwards (a restart policy may start a new one).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The command could not be started at all (not found, not executable).
    Spawn(String),
    /// The program closed its stdout (usually: exited or crashed); its exit status when known.
    Exited(Option<String>),
    /// No complete line within the timeout.
    Timeout(Duration),
    /// Writing the request failed (the program closed its stdin).
    Write(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Spawn(e) => write!(f, "could not be started: {e}"),
            Fault::Exited(Some(status)) => write!(f, "exited ({status})"),
            Fault::Exited(None) => f.write_str("closed its stdout"),
            Fault::Timeout(t) => write!(f, "did not answer within {}", seconds(*t)),
            Fault::Write(e) => write!(f, "stopped reading its stdin ({e})"),
        }
    }
}

/// `1.5 s`, `30 s`.
pub fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

/// The stderr log: the file once attached, and until then the lines written so far.
#[derive(Default)]
struct StderrLog {
    file: Option<std::fs::File>,
    early: Vec<String>,
    early_bytes: usize,
    /// Lines dropped from `early` once it held [`EARLY_STDERR_BYTES`].
    dropped: usize,
}

impl StderrLog {
    fn write(&mut self, line: String) {
        match &mut self.file {
            Some(f) => {
                let _ = writeln!(f, "{line}");
            }
            None if self.early_bytes + line.len() <= EARLY_STDERR_BYTES => {
                self.early_bytes += line.len() + 1;
                self.early.push(line);
            }
            None => self.dropped += 1,
        }
    }
}

/// A running program.
pub struct Process {
    child: Child,
    /// Lines for the writer thread; dropping it closes the program's stdin.
    stdin: Option<Sender<String>>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Where every stderr line is also appended (the run directory's log).
    stderr_log: Arc<Mutex<StderrLog>>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Process {
    /// Starts `command[0]` with the rest as arguments (looked up in `PATH` when it has no `/`,
    /// else relative to the working directory), with `FLOWRL_NODE=<node>` in its environment.
    pub fn spawn(command: &[String], node: &str) -> Result<Process, Fault> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| Fault::Spawn("the command is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            .env("FLOWRL_NODE", node)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Fault::Spawn(format!("`{program}`: {e}")))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr_pipe = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr.clone();
        let stderr_log = Arc::new(Mutex::new(StderrLog::default()));
        let log = stderr_log.clone();
        let stderr_thread = std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr_pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.by_ref().take(64 * 1024).read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                        log.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .write(line.clone());
                        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                        if t.len() == STDERR_LINES {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            }
        });
        let mut pipe = child.stdin.take().expect("piped stdin");
        let (stdin, requests) = mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in requests {
                let ok = pipe
                    .write_all(line.as_bytes())
                    .and_then(|_| pipe.write_all(b"\n"))
                    .and_then(|_| pipe.flush());
                if ok.is_err() {
                    break;
                }
            }
        });
        let stdin = Some(stdin);
        Ok(Process {
            child,
            stdin,
            lines,
            stderr,
            stderr_log,
            stderr_thread: Some(stderr_thread),
        })
    }

    /// Queues one line for the program's stdin (a newline is appended). A program that stopped
    /// reading shows up as a timeout or an exit on the next [`Process::recv`].
    pub fn send(&mut self, line: &str) -> Result<(), Fault> {
        self.stdin
            .as_ref()
            .ok_or_else(|| Fault::Write("stdin already closed".into()))?
            .send(line.to_string())
            .map_err(|_| Fault::Write("its stdin is closed".into()))
    }

    /// A stdout line the program has written but nobody has read yet (blank lines skipped):
    /// between requests there must be none.
    pub fn unread_line(&mut self) -> Option<String> {
        loop {
            match self.lines.try_recv() {
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) => return Some(line),
                Err(_) => return None,
            }
        }
    }

    /// The next line of stdout, waiting at most `timeout`. Blank lines are skipped.
    pub fn recv(&mut self, timeout: Duration) -> Result<String, Fault> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.trim().is_empty() => continue,
                Ok(line) => return Ok(line),
                Err(RecvTimeoutError::Timeout) => return Err(Fault::Timeout(timeout)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Fault::Exited(self.wait_briefly()));
                }
            }
        }
    }

    /// The exit status once the program has exited (waits up to the grace period).
    fn wait_briefly(&mut self) -> Option<String> {
        let deadline = Instant::now() + EXIT_GRACE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.join_stderr();
                    return Some(status.to_string());
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => return None,
            }
        }
    }

    /// Lets the stderr reader finish (bounded: a grandchild may hold the pipe open).
    fn join_stderr(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(500);
        while let Some(h) = &self.stderr_thread {
            if h.is_finished() {
                let _ = self.stderr_thread.take().map(JoinHandle::join);
            } else if Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            } else {
                break;
            }
        }
    }

    /// Appends every stderr line to `path` (its directory is created): first the lines written
    /// since the program started, then each new one.
    pub fn log_stderr_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let mut log = self.stderr_log.lock().unwrap_or_else(|e| e.into_inner());
        for line in log.early.drain(..) {
            writeln!(f, "{line}")?;
        }
        if log.dropped > 0 {
            writeln!(
                f,
                "[flowrl: {} more lines of start-up stderr were not kept]",
                log.dropped
            )?;
        }
        log.file = Some(f);
        Ok(())
    }

    /// The last lines the program wrote to stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Kills the program at once (after a timeout or a garbled answer) and collects its stderr.
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.join_stderr();
    }
}

impl Drop for Process {
    /// Closes stdin (end of input: the program should exit), waits the grace period, then kills.
    fn drop(&mut self) {
        self.stdin = None;
        if self.wait_briefly().is_none() {
            self.kill();
        }
    }
}
