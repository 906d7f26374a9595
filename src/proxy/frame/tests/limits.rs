//! Limits: over-limit headers are refused when read, allowed ones cost no
//! memory until their bytes arrive, and nesting is bounded without recursion.

use super::*;

/// Counts the bytes the current thread allocates, so a test can show that a
/// huge length header costs no memory. Per thread, so parallel tests do not
/// disturb each other's counts.
pub(super) mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static ALLOCATED: Cell<usize> = const { Cell::new(0) };
    }

    fn count(bytes: usize) {
        // try_with: allocations also happen while thread-locals are torn down.
        let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(bytes)));
    }

    struct Counting;

    // SAFETY: every call is passed unchanged to the system allocator; the
    // wrapper only adds up sizes in a thread-local that never allocates.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count(layout.size());
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// Runs `f`, returning its result and the bytes it allocated.
    pub fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
        let before = ALLOCATED.with(Cell::get);
        let out = f();
        (out, ALLOCATED.with(Cell::get) - before)
    }
}

use counting::allocated_by;

#[test]
fn huge_headers_are_refused_at_once_or_cost_nothing() {
    let err = |buf: &[u8]| parse(buf, &lim()).unwrap_err();
    assert_eq!(err(b"$1000000000\r\n"), ProtocolError::InvalidBulkLength);
    assert_eq!(err(b"$67108865\r\n"), ProtocolError::InvalidBulkLength);
    assert_eq!(parse(b"$67108864\r\n", &lim()), Ok(None));
    assert_eq!(err(b"*1048577\r\n"), ProtocolError::InvalidMultibulkLength);
    assert_eq!(err(b"%524289\r\n"), ProtocolError::InvalidMultibulkLength);
    assert_eq!(
        err(b"*99999999999999999999\r\n"),
        ProtocolError::InvalidMultibulkLength
    );
    assert_eq!(parse(b"|524288\r\n", &lim()), Ok(None));

    // Even when the limits allow it, a header alone allocates (nearly) nothing.
    let open = Limits {
        max_bulk_len: usize::MAX,
        max_elements: usize::MAX,
        ..lim()
    };
    let (r, bytes) = allocated_by(|| parse(b"$1000000000\r\nabc", &open));
    assert_eq!((r, bytes < 1024), (Ok(None), true), "{bytes} bytes");
    let (r, bytes) = allocated_by(|| parse(b"*1000000\r\n:1\r\n:2\r\n:3\r\n", &open));
    assert_eq!((r, bytes < 1024), (Ok(None), true), "{bytes} bytes");
    let (r, bytes) =
        allocated_by(|| parse_command(b"*1000000\r\n$1\r\na\r\n$1000000000\r\n", &open));
    assert_eq!((r, bytes < 1024), (Ok(None), true), "{bytes} bytes");
}

#[test]
fn depth_bomb_is_an_error_not_a_stack_overflow() {
    let bomb = b"*1\r\n".repeat(100_000);
    let (r, bytes) = allocated_by(|| parse(&bomb, &lim()));
    assert_eq!(r, Err(ProtocolError::TooDeep));
    assert!(bytes < 64 * 1024, "{bytes} bytes");
    // A limit above the hard cap is held to the cap.
    let deep = Limits {
        max_depth: usize::MAX,
        ..lim()
    };
    assert_eq!(parse(&bomb, &deep), Err(ProtocolError::TooDeep));
    assert_eq!(
        Decoder::new(deep).frame_len(&bomb),
        Err(ProtocolError::TooDeep)
    );
}

#[test]
fn nesting_up_to_max_depth_is_allowed() {
    let nested = |depth: usize| [b"*1\r\n".repeat(depth), b":1\r\n".to_vec()].concat();
    let ok = nested(64);
    assert_eq!(parse(&ok, &lim()).unwrap().map(|(_, n)| n), Some(ok.len()));
    assert_eq!(parse(&nested(65), &lim()), Err(ProtocolError::TooDeep));
    assert_eq!(
        parse(
            b"*0\r\n",
            &Limits {
                max_depth: 0,
                ..lim()
            }
        ),
        Err(ProtocolError::TooDeep)
    );
}

#[test]
fn lines_are_bounded() {
    let max = lim().max_inline_len;
    let line = |len: usize| [b"+".to_vec(), vec![b'a'; len]].concat();
    assert_eq!(parse(&line(max), &lim()), Ok(None));
    assert_eq!(
        parse(&line(max + 1), &lim()),
        Err(ProtocolError::LineTooLong)
    );
    let full = [line(max), b"\r\n".to_vec()].concat();
    assert_eq!(
        parse(&full, &lim()).unwrap().map(|(_, n)| n),
        Some(full.len())
    );

    let inline = |len: usize, end: &[u8]| [vec![b'a'; len], end.to_vec()].concat();
    assert!(parse_command(&inline(max, b"\r\n"), &lim())
        .unwrap()
        .is_some());
    assert_eq!(parse_command(&inline(max, b"\r"), &lim()), Ok(None));
    assert_eq!(
        parse_command(&inline(max + 1, b"\n"), &lim()),
        Err(ProtocolError::InlineTooLong)
    );
    assert_eq!(
        parse_command(&inline(max + 1, b""), &lim()),
        Err(ProtocolError::InlineTooLong)
    );
}
