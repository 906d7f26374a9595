//! Peak memory of the RESP parser under hostile length headers, measured by a
//! counting global allocator (its own test binary, so nothing else allocates
//! through it). A frame that declares a 1 GiB bulk string or a 2^31-element
//! array must cost memory for the bytes present, never for the bytes
//! promised: the proxy keeps one such buffer per connection.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use qbridge::proxy::frame::{parse, parse_command, Decoder, Limits, ProtocolError};

/// Live bytes and the highest they reached since the last reset.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

struct Tracking;

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::SeqCst) + bytes;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: every call goes unchanged to the system allocator; the wrapper only
// keeps two atomic counters.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Tests run on parallel threads and the counters are global: each test
/// holds this for its whole run, input building included.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn alone() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

const MIB: usize = 1024 * 1024;

/// Runs `f` (with [`alone`] held) and returns its result and the peak of live bytes above the
/// starting level while it ran.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let out = f();
    (out, PEAK.load(Ordering::SeqCst).saturating_sub(base))
}

/// Limits that allow any length, so only the parser's own care bounds memory.
fn open() -> Limits {
    Limits {
        max_bulk_len: usize::MAX,
        max_elements: usize::MAX,
        ..Limits::default()
    }
}

#[test]
fn default_limits_refuse_giant_headers_with_no_memory_spent() {
    let _alone = alone();
    let headers: [&[u8]; 5] = [
        b"$1073741824\r\n",
        b"$9223372036854775807\r\n",
        b"*2147483648\r\n",
        b"%2147483648\r\n",
        b"*-5\r\n",
    ];
    for header in headers {
        let (r, peak) = peak_of(|| parse(header, &Limits::default()));
        assert!(
            matches!(
                r,
                Err(ProtocolError::InvalidBulkLength | ProtocolError::InvalidMultibulkLength)
            ),
            "{r:?}"
        );
        assert!(peak < 64 * 1024, "{peak} bytes");
        // Only `*` starts a multibulk command (anything else is inline text).
        if header[0] == b'*' {
            let (r, peak) = peak_of(|| parse_command(header, &Limits::default()));
            assert_eq!(r, Err(ProtocolError::InvalidMultibulkLength));
            assert!(peak < 64 * 1024, "{peak} bytes");
        }
    }
}

/// A 1 GiB bulk string arriving in 64 KiB reads: the decoder holds only what
/// arrived (8 MiB here, the test's own buffer) and scans it without copying.
#[test]
fn a_declared_gibibyte_costs_only_the_bytes_that_arrived() {
    let _alone = alone();
    let (r, peak) = peak_of(|| {
        let mut buf = b"*2\r\n$5\r\nLPUSH\r\n$1073741824\r\n".to_vec();
        buf.reserve(8 * MIB + 64 * 1024);
        let mut decoder = Decoder::new(open());
        let chunk = vec![b'x'; 64 * 1024];
        let mut last = decoder.frame_len(&buf);
        while buf.len() < 8 * MIB {
            buf.extend_from_slice(&chunk);
            last = decoder.frame_len(&buf);
            assert_eq!(last, Ok(None));
        }
        (last, parse_command(&buf, &open()), parse(&buf, &open()))
    });
    assert_eq!(r, (Ok(None), Ok(None), Ok(None)));
    // The 8 MiB buffer and its chunk, plus well under 1 MiB of parser state.
    assert!(peak < 9 * MIB + 64 * 1024, "{} MiB", peak / MIB);
}

/// 2^31 elements declared, 100,000 present: the parsers' memory follows the
/// 100,000, not the 2^31 (which would be tens of GiB of frame slots).
#[test]
fn a_declared_two_to_the_31_elements_cost_only_those_present() {
    let _alone = alone();
    let mut command = b"*2147483648\r\n".to_vec();
    let mut reply = b"*2147483648\r\n".to_vec();
    for _ in 0..100_000 {
        command.extend_from_slice(b"$1\r\na\r\n");
        reply.extend_from_slice(b":1\r\n");
    }
    let (r, peak) = peak_of(|| parse_command(&command, &open()));
    assert_eq!(r, Ok(None));
    assert!(peak < 4 * MIB, "{} MiB", peak / MIB);
    let (r, peak) = peak_of(|| parse(&reply, &open()));
    assert_eq!(r, Ok(None));
    assert!(peak < 64 * 1024, "{peak} bytes");
    let (r, peak) = peak_of(|| Decoder::new(open()).frame_len(&reply));
    assert_eq!(r, Ok(None));
    assert!(peak < 64 * 1024, "{peak} bytes");
}

/// The depth bomb under the open limits: refused at the hard depth cap with
/// a small, fixed amount of state.
#[test]
fn a_depth_bomb_is_refused_with_little_memory() {
    let _alone = alone();
    let bomb = b"*1\r\n".repeat(1_000_000);
    let limits = Limits {
        max_depth: usize::MAX,
        ..open()
    };
    let (r, peak) = peak_of(|| parse(&bomb, &limits));
    assert_eq!(r, Err(ProtocolError::TooDeep));
    assert!(peak < MIB, "{peak} bytes");
}
