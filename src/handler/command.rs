//! The `command` handler: runs a program with the payload on stdin and keeps the
//! tail of its stderr as the error text. stdin, stderr and the exit are watched
//! at once, in bounded memory, and the program's exit ends the attempt even when
//! a process it started still holds a pipe.

use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, ChildStdin};

use super::HandlerResult;
use crate::queue::ClaimedJob;

/// Most stderr kept as the error text of a failed command.
const STDERR_TAIL: usize = 2048;

/// Bytes read from a command's stderr at a time.
const STDERR_CHUNK: usize = 8192;

/// How long stderr is still read once the command exited: long enough to
/// collect what it wrote before exiting, short enough that a grandchild which
/// inherited the pipe cannot hold the job until the timeout.
const STDERR_GRACE: Duration = Duration::from_millis(100);

/// Runs one attempt of a command handler.
pub(super) async fn run(
    program: &str,
    args: &[String],
    timeout: Duration,
    permanent: &[i32],
    job: &ClaimedJob,
    mode: &str,
) -> HandlerResult {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env("QBRIDGE_MODE", mode)
        .env("QBRIDGE_QUEUE", &job.queue)
        .env("QBRIDGE_JOB_ID", job.id.to_string())
        .env("QBRIDGE_ATTEMPT", job.attempts.to_string())
        .env("QBRIDGE_LEASE", job.lease.to_string())
        .env("QBRIDGE_JOB_KEY", job.key.as_deref().unwrap_or(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // A timeout or a cancelled attempt drops the child: kill it then.
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return HandlerResult::Retry(format!("cannot start {program:?}: {e}")),
    };
    let body = job.payload.to_string();
    let stdin = child.stdin.take();
    let stderr = child.stderr.take();
    let mut tail = Tail::default();
    let work = supervise(&mut child, stdin, stderr, body.as_bytes(), &mut tail);
    let status = match tokio::time::timeout(timeout, work).await {
        Err(_) => return HandlerResult::Retry(format!("command timed out after {timeout:?}")),
        Ok(Err(e)) => return HandlerResult::Retry(format!("command failed: {e}")),
        Ok(Ok(status)) => status,
    };
    if status.success() {
        return HandlerResult::Done;
    }
    let what = match status.code() {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_string(),
    };
    let tail = tail.text();
    let msg = if tail.is_empty() {
        what
    } else {
        format!("{what}: {tail}")
    };
    match status.code() {
        Some(code) if permanent.contains(&code) => HandlerResult::Permanent(msg),
        _ => HandlerResult::Retry(msg),
    }
}

/// Feeds the payload to stdin and keeps the tail of stderr while waiting for
/// the program to exit. All three run at once: a program may write a lot of
/// stderr before it reads its input, and either pipe fills up when nobody
/// drains it. The exit decides: stderr gets [`STDERR_GRACE`] more, and input
/// not yet written is dropped (a grandchild may hold either pipe open).
async fn supervise(
    child: &mut Child,
    stdin: Option<ChildStdin>,
    stderr: Option<ChildStderr>,
    body: &[u8],
    tail: &mut Tail,
) -> std::io::Result<ExitStatus> {
    let feed = async move {
        if let Some(mut s) = stdin {
            // A program that exits without reading stdin is not an error.
            let _ = s.write_all(body).await;
            // Dropping `s` closes the pipe: the program sees the end of input.
        }
    };
    let watch = async {
        let mut reading = pin!(tail.read_from(stderr));
        let mut exited = pin!(child.wait());
        tokio::select! {
            status = &mut exited => {
                let _ = tokio::time::timeout(STDERR_GRACE, &mut reading).await;
                status
            }
            () = &mut reading => exited.await,
        }
    };
    let mut feed = pin!(feed);
    let mut watch = pin!(watch);
    tokio::select! {
        status = &mut watch => status,
        () = &mut feed => watch.await,
    }
}

/// The last [`STDERR_TAIL`] bytes of a stream, in bounded memory however much
/// the program writes.
#[derive(Debug, Default)]
struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= STDERR_TAIL {
            self.buf.clear();
            self.buf
                .extend_from_slice(&bytes[bytes.len() - STDERR_TAIL..]);
            return;
        }
        let over = (self.buf.len() + bytes.len()).saturating_sub(STDERR_TAIL);
        self.buf.drain(..over);
        self.buf.extend_from_slice(bytes);
    }

    /// Reads `stream` to its end (or first error) in chunks.
    async fn read_from<R: AsyncRead + Unpin>(&mut self, stream: Option<R>) {
        let Some(mut stream) = stream else { return };
        let mut chunk = vec![0u8; STDERR_CHUNK];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => self.push(&chunk[..n]),
            }
        }
    }

    /// The tail as one line: its lines trimmed and joined with " | ".
    fn text(&self) -> String {
        // The cut may fall inside a UTF-8 character: skip its leftover bytes.
        let start = self
            .buf
            .iter()
            .position(|b| b & 0xC0 != 0x80)
            .unwrap_or(self.buf.len());
        String::from_utf8_lossy(&self.buf[start..])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;

    use super::*;
    use crate::handler::tests::job;
    use crate::handler::Handler;

    fn sh(script: &str, timeout: Duration) -> Handler {
        Handler::Command {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout,
            permanent_exit_codes: vec![],
        }
    }

    /// A payload bigger than any pipe buffer.
    fn big_payload() -> serde_json::Value {
        json!({ "blob": "p".repeat(300_000) })
    }

    /// The program fills its stderr pipe before it reads stdin: writing all of
    /// stdin first would deadlock until the timeout.
    #[tokio::test]
    async fn stderr_written_before_stdin_is_read_does_not_deadlock() {
        let payload = big_payload();
        let len = payload.to_string().len();
        let h = sh(
            "head -c 200000 /dev/zero | tr '\\0' e >&2; n=$(wc -c); echo \"\ngot $((n))\" >&2; exit 7",
            Duration::from_secs(5),
        );
        let HandlerResult::Retry(msg) = h.run(&job(payload)).await else {
            panic!("want a retry");
        };
        assert!(msg.starts_with("exit code 7: e"), "{msg}");
        assert!(msg.ends_with(&format!(" | got {len}")), "{msg}");
        assert!(msg.len() <= STDERR_TAIL + 20, "{} bytes", msg.len());
    }

    /// A background process that inherited stderr must not hold the job after
    /// the command itself exited.
    #[tokio::test]
    async fn grandchild_holding_stderr_does_not_hold_the_job() {
        let h = sh(
            "sleep 10 & echo failing >&2; exit 1",
            Duration::from_secs(30),
        );
        let started = Instant::now();
        let r = h.run(&job(json!({}))).await;
        assert_eq!(r, HandlerResult::Retry("exit code 1: failing".into()));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    /// Nor one that inherited stdin and never reads it.
    #[tokio::test]
    async fn grandchild_holding_stdin_does_not_hold_the_job() {
        let h = sh("sleep 10 <&0 & exit 0", Duration::from_secs(30));
        let started = Instant::now();
        let r = h.run(&job(big_payload())).await;
        assert_eq!(r, HandlerResult::Done);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn large_stderr_keeps_only_its_tail() {
        let h = sh(
            "head -c 5000000 /dev/zero | tr '\\0' x >&2; printf '\\nlast words\\n' >&2; exit 1",
            Duration::from_secs(30),
        );
        let HandlerResult::Retry(msg) = h.run(&job(json!({}))).await else {
            panic!("want a retry");
        };
        assert!(msg.ends_with(" | last words"), "{msg}");
        assert!(msg.len() <= STDERR_TAIL + 20, "{} bytes", msg.len());
    }

    #[test]
    fn tail_memory_is_bounded() {
        let mut tail = Tail::default();
        let mut n = 0u64;
        for size in [1, 100, 2047, 2048, 2049, 8192, 1, 3000]
            .iter()
            .cycle()
            .take(5000)
        {
            let chunk: Vec<u8> = (0..*size)
                .map(|i| b'a' + ((n + i as u64) % 26) as u8)
                .collect();
            n += *size as u64;
            tail.push(&chunk);
            assert!(tail.buf.len() <= STDERR_TAIL);
            assert!(
                tail.buf.capacity() <= 2 * STDERR_TAIL,
                "{}",
                tail.buf.capacity()
            );
        }
        let want: Vec<u8> = (n - STDERR_TAIL as u64..n)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        assert_eq!(tail.buf, want);
    }

    #[test]
    fn tail_text_is_one_line_and_skips_a_cut_character() {
        let mut tail = Tail::default();
        tail.push("é".repeat(STDERR_TAIL).as_bytes());
        tail.push(b"\nfirst\r\n\n  second  \n");
        let text = tail.text();
        assert!(!text.contains('\u{fffd}'), "{text}");
        assert!(text.ends_with("é | first | second"), "{text}");
    }
}
