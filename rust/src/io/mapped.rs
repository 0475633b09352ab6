//! Read-only memory maps of data files whose page faults cannot kill the process.
//!
//! A mapping covers one byte range of a file (a recording's runs; `mmap` starts it at the page
//! boundary at or below the range), and copies out of it are addressed by file offset.
//!
//! A batch row copied from a mapping costs a user-space `memcpy`; the same row read with `pread`
//! costs a system call and a kernel copy, about 2x more here (docs/design.md "The guarded map"
//! has the measurements). A plain mapping has one fatal flaw: when the file is truncated under
//! it, a touch of a page past the new end raises SIGBUS and the process dies without a word. This
//! module keeps the speed and removes the flaw:
//!
//! * Every copy out of a mapping runs inside a *guard*: the thread records, in a thread-local,
//!   the mapping's address range and its `poisoned` flag.
//! * A SIGBUS handler (installed once, chained to whatever handler was there before) looks at
//!   the faulting address. A kernel-raised fault inside the current thread's guarded range sets
//!   the mapping's `poisoned` flag, maps a private zero page over the faulting page and returns,
//!   so the copy finishes (with zeros there). Any other SIGBUS goes to the previous handler, or,
//!   when there was none, gets the default action (the process dies as it always would).
//! * A copy that saw its mapping poisoned (by its own fault or another thread's) reports
//!   failure, and the caller re-reads the row with `pread`, which either succeeds (the bytes are
//!   there again) or comes up short (`LengthChanged`, one line naming the file). A poisoned
//!   mapping is never read again: the zero pages it now holds would hide a restored file.
//! * A truncation that ends inside a window's last page raises no fault (the page still exists,
//!   zero-filled past the end); the caller checks the lengths of the mapped files a batch read
//!   (one `fstat` each) and poisons any that shrank, which sends its rows back to `pread` too.
//!
//! Linux only (the handler reads `si_code`/`si_addr` as Linux fills them); elsewhere nothing is
//! mapped and every read is a `pread`.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};

/// Data files smaller than this are read with `pread` by default: mapping them buys little
/// (their rows come from many files, and the length check costs one `fstat` per file per batch)
/// and each mapping is a kernel VMA, a limited resource (`vm.max_map_count`, 65530 by default).
pub const DEFAULT_MAP_MIN_BYTES: u64 = 256 * 1024;

/// At most this many recordings of one dataset are mapped; the rest are read with `pread`.
/// Each mapping is one VMA, and each page patched after a truncation splits it in up to three.
pub const MAX_MAPPED: usize = 8192;

/// At most this many mappings live in the process at once (every dataset together): the
/// handler's registry, and a cap well below the kernel's default `vm.max_map_count` (65530),
/// leaving room for patched pages and for everything else the process maps.
pub const MAX_LIVE_MAPPINGS: usize = 16384;

/// A read-only shared mapping of a byte range of a data file. Only `sys::map` makes one, and
/// its `Drop` (in `sys`) unmaps it.
pub struct Mapping {
    /// The start of the mapped memory: file byte `file_offset` (a page boundary).
    base: *const u8,
    /// Bytes mapped from `base` (what the handler's registry holds).
    len: usize,
    /// The file offset `base` maps.
    file_offset: u64,
    poisoned: AtomicBool,
}

// SAFETY: `base` is the only thing that keeps Mapping from being Send automatically, and it is
// not tied to a thread: the mapping is process-wide memory that this value alone owns (made by
// `sys::map`, unmapped only by its own Drop), and nothing is ever written through it. Reads go
// through `sys::guarded_copy`, whose guard lives in the calling thread's own thread-local, so
// a copy works the same on whichever thread the value has moved to.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` offers only `copy_to` (a read of read-only memory that stays mapped while
// the borrow lives; each thread sets its own guard) and the atomic `poisoned` flag: concurrent
// use from several threads shares nothing that is not atomic. Dropping (the unmap) needs the
// value itself, so no shared borrow can outlive the mapping.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps bytes `[offset, offset + len)` of `file` (from `offset` rounded down to a page
    /// boundary, as `mmap` needs), or `None` when mapping is unavailable (not Linux, the SIGBUS
    /// guard could not be installed, `mmap` failed, or `len` is 0): the caller then reads with
    /// `pread`, so a failure here only costs speed.
    pub fn new(file: &File, offset: u64, len: u64) -> Option<Mapping> {
        sys::map(file, offset, len)
    }

    /// The file bytes `[start, end)` mapped (`start` a page boundary).
    #[cfg(test)]
    pub(crate) fn range(&self) -> (u64, u64) {
        (self.file_offset, self.file_offset + self.len as u64)
    }

    /// True once a copy faulted or the file was seen shorter than the mapping: from then on the
    /// mapping holds zero pages where the file had data, and every read must use `pread`.
    pub fn poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Copies the `out.len()` bytes at `offset` in the FILE into `out`. False when the mapping
    /// is (or became, during the copy) poisoned: `out` may then hold zeros and the caller must
    /// re-read the row. The range must be within the mapping (the caller's windows are, by
    /// construction); a range outside it is refused (false) rather than read.
    pub fn copy_to(&self, offset: u64, out: &mut [u8]) -> bool {
        let start = offset
            .checked_sub(self.file_offset)
            .and_then(|o| usize::try_from(o).ok());
        let Some(start) = start else {
            return false;
        };
        if self.poisoned() || !sys::guarded_copy(self, start, out) {
            return false;
        }
        // The copy's loads must not be reordered after the flag's load (they can on arm64 with
        // an Acquire load alone: a zero page another thread faulted in could then be read with
        // the flag still seen false).
        std::sync::atomic::fence(Ordering::SeqCst);
        !self.poisoned()
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::cell::Cell;
    use std::fs::File;
    use std::os::unix::io::AsRawFd;
    use std::ptr;
    use std::sync::atomic::{compiler_fence, AtomicBool, AtomicI32, AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::{Mapping, MAX_LIVE_MAPPINGS};

    /// The range being copied from by this thread and its mapping's flag; (0, 0, null) outside
    /// a copy. `const`-initialised and without a destructor. The handler reads it only for a
    /// fault inside a registered mapping, which only a guarded copy touches: that thread set
    /// the guard just before, so its thread-local block exists and reading it allocates nothing.
    struct Guard {
        start: Cell<usize>,
        end: Cell<usize>,
        poisoned: Cell<*const AtomicBool>,
    }

    thread_local! {
        static GUARD: Guard = const {
            Guard {
                start: Cell::new(0),
                end: Cell::new(0),
                poisoned: Cell::new(ptr::null()),
            }
        };
    }

    /// Every live mapping's `[start, end)`, lock-free for the handler (0 = a free slot; `end` is
    /// written before `start` is published and cleared after it). Full: no more mappings.
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));
    static LIVE: [(AtomicUsize, AtomicUsize); MAX_LIVE_MAPPINGS] = [FREE; MAX_LIVE_MAPPINGS];

    /// The handler (`sa_sigaction`) and flags of the SIGBUS action that was installed before
    /// ours, published before ours is installed (so the handler never reads them unset).
    static PREVIOUS_HANDLER: AtomicUsize = AtomicUsize::new(libc::SIG_DFL);
    static PREVIOUS_FLAGS: AtomicI32 = AtomicI32::new(0);
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    static INSTALL: Mutex<bool> = Mutex::new(false);
    /// Set while a SIGBUS is being handed to the previous handler: a re-entry (a handler that
    /// re-raises into ours) ends with the default action instead of a loop.
    static CHAINING: AtomicBool = AtomicBool::new(false);

    fn register(start: usize, end: usize) -> bool {
        for (s, e) in LIVE.iter() {
            if s.load(Ordering::Relaxed) == 0
                && s.compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // Claimed (usize::MAX matches no address); publish the range, start last.
                e.store(end, Ordering::Release);
                s.store(start, Ordering::Release);
                return true;
            }
        }
        false
    }

    fn unregister(start: usize) {
        for (s, e) in LIVE.iter() {
            if s.load(Ordering::Acquire) == start {
                s.store(usize::MAX, Ordering::Release);
                e.store(0, Ordering::Release);
                s.store(0, Ordering::Release);
                return;
            }
        }
    }

    fn registered(addr: usize) -> bool {
        LIVE.iter().any(|(s, e)| {
            let start = s.load(Ordering::Acquire);
            start != 0 && start != usize::MAX && addr >= start && addr < e.load(Ordering::Acquire)
        })
    }

    /// Maps `[offset, offset + len)` of `file` from the page boundary at or below `offset`.
    pub(super) fn map(file: &File, offset: u64, len: u64) -> Option<Mapping> {
        if len == 0 || !install() {
            return None;
        }
        // Set by install(); a page size is a power of two (anything else maps nothing).
        let page = Some(PAGE.load(Ordering::Relaxed) as u64).filter(|p| p.is_power_of_two())?;
        let aligned = offset & !(page - 1);
        let len = usize::try_from(offset.checked_add(len)? - aligned).ok()?;
        let at = libc::off_t::try_from(aligned).ok()?;
        // SAFETY: mmap with a null hint picks fresh addresses (MAP_FIXED is not set), so it
        // cannot replace memory anything else uses; `len` is non-zero and `at` page-aligned, and
        // any other failure (a bad descriptor, a range past what the kernel allows) comes back
        // as MAP_FAILED, handled below. madvise applies to exactly the mapping just made (`p`
        // as mmap returned it, `len` its length); MADV_RANDOM changes read-ahead only, never
        // contents, and a failure only loses the hint.
        let p = unsafe {
            let p = libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                at,
            );
            if p != libc::MAP_FAILED {
                // Windows are read in a shuffled order: without this, each fault on a page not
                // in the page cache reads ahead around it (read_ahead_kb, often megabytes) for
                // one window.
                libc::madvise(p, len, libc::MADV_RANDOM);
            }
            p
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // From here the Mapping owns the memory: its Drop unmaps it on every path below.
        let m = Mapping {
            base: p as *const u8,
            len,
            file_offset: aligned,
            poisoned: AtomicBool::new(false),
        };
        if !register(p as usize, p as usize + len) {
            return None; // the registry is full: this file reads with pread
        }
        Some(m)
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            unregister(self.base as usize);
            // SAFETY: (base, len) is exactly what `map` got from mmap for this value (only `map`
            // makes a Mapping), Drop runs once, and `&mut self` means no copy is reading it.
            // Unregistered first, so the handler no longer treats the range as ours.
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
        }
    }

    /// Installs the handler once per process (chained to the one found then). False when it
    /// cannot be installed, or when someone replaced ours since (e.g. Python's faulthandler
    /// enabled late): putting ours back in front would make that handler's re-raise loop
    /// through ours, so new mappings are refused and their files read with `pread` instead.
    fn install() -> bool {
        let mut installed = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: sigaction reads and writes only the two local structs passed by pointer, each
        // a valid value (all-zero is a valid `sigaction`: integers, a mask, a handler address
        // of 0 = SIG_DFL); sysconf and sigemptyset have no preconditions. Installing
        // `on_sigbus` is sound: it is an `extern "C"` fn with the SA_SIGINFO signature, and it
        // only does what a signal handler may (see there). The INSTALL lock serialises this.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, ptr::null(), &mut current) != 0 {
                return false;
            }
            if current.sa_sigaction == on_sigbus as *const () as usize {
                return true;
            }
            if *installed {
                return false; // replaced since: see above
            }
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page <= 0 {
                return false;
            }
            PAGE.store(page as usize, Ordering::Relaxed);
            // Published before ours is installed: the handler never sees a stale previous.
            PREVIOUS_HANDLER.store(current.sa_sigaction, Ordering::Release);
            PREVIOUS_FLAGS.store(current.sa_flags, Ordering::Release);
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_sigbus as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            *installed = libc::sigaction(libc::SIGBUS, &ours, ptr::null_mut()) == 0;
            *installed
        }
    }

    /// Copies `out.len()` bytes from byte `start` of mapping `m` with this thread's guard set;
    /// false (nothing read) when the range is not inside the mapping.
    pub(super) fn guarded_copy(m: &Mapping, start: usize, out: &mut [u8]) -> bool {
        if start.checked_add(out.len()).is_none_or(|end| end > m.len) {
            return false;
        }
        GUARD.with(|g| {
            g.start.set(m.base as usize);
            g.end.set(m.base as usize + m.len);
            g.poisoned.set(&m.poisoned);
        });
        // The handler runs on this thread: a compiler fence orders the guard against the copy.
        compiler_fence(Ordering::SeqCst);
        // Raw pointers, never a slice of the mapping: its bytes may change under us.
        // SAFETY: [start, start + out.len()) lies inside [base, base + len) (checked above),
        // memory `m` keeps mapped and readable while it is borrowed here; a page the file no
        // longer backs raises SIGBUS, which the handler absorbs (a zero page) because the guard
        // above names this range. `out` is a `&mut` borrow of writable memory, so it cannot
        // overlap the read-only mapping.
        unsafe { crate::io::copy_bytes(m.base.add(start), out.as_mut_ptr(), out.len()) };
        compiler_fence(Ordering::SeqCst);
        GUARD.with(|g| {
            g.start.set(0);
            g.end.set(0);
            g.poisoned.set(ptr::null());
        });
        true
    }

    /// The SIGBUS handler. A fault in this thread's guarded copy is absorbed (`absorb`); any
    /// other SIGBUS goes to the handler installed before ours. With none (or SIG_DFL), or on a
    /// re-entry while chaining, it restores the default: a fault then returns and faults again
    /// with its own siginfo, a sent signal is re-raised. With SIG_IGN, a sent signal stays
    /// ignored and a fault gets the default (a fault cannot be ignored). Everything here is
    /// async-signal-safe: atomic loads and stores, a thread-local read only for a registered
    /// address, mmap, signal, raise.
    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // SAFETY: ours is installed with SA_SIGINFO, so the kernel calls it with `info` pointing
        // at this signal's siginfo_t. si_code > 0 means the kernel raised it for a memory access
        // (not kill/raise), and then si_addr is the union member it filled (for a sent signal
        // that field holds a pid, so it is not read).
        let (fault, addr) = unsafe {
            let fault = (*info).si_code > 0;
            (fault, if fault { (*info).si_addr() as usize } else { 0 })
        };
        if fault && registered(addr) && absorb(addr) {
            return; // the copy resumes and reads zeros; the flag tells the caller
        }
        let handler = PREVIOUS_HANDLER.load(Ordering::Acquire);
        if handler == libc::SIG_IGN && !fault {
            return;
        }
        let reentered = CHAINING.swap(true, Ordering::AcqRel);
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN || reentered {
            // SAFETY: signal and raise are async-signal-safe and take plain values; restoring
            // the default action for `sig` is what the process would have had without us.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                if !fault {
                    libc::raise(sig);
                }
            }
            return;
        }
        // SAFETY: `handler` is the previous action's `sa_sigaction`, neither SIG_DFL nor
        // SIG_IGN, so a function the process installed for SIGBUS with the signature its
        // SA_SIGINFO flag names (three arguments with it, one without); it gets this
        // invocation's own arguments, as the kernel would have passed them to it.
        unsafe {
            if PREVIOUS_FLAGS.load(Ordering::Acquire) & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(sig);
            }
        }
        CHAINING.store(false, Ordering::Release);
    }

    /// A fault at `addr` in this thread's guarded range: poison the mapping and map a zero page
    /// over the faulting one. False (nothing touched) when the fault is not in a guarded copy
    /// of this thread.
    fn absorb(addr: usize) -> bool {
        let (start, end, flag) = GUARD.with(|g| (g.start.get(), g.end.get(), g.poisoned.get()));
        if start == 0 || addr < start || addr >= end || flag.is_null() {
            return false;
        }
        let page = PAGE.load(Ordering::Relaxed);
        // SAFETY: a set guard means this thread is inside `guarded_copy` (the fault interrupted
        // it), which set it from a Mapping borrowed for the whole copy: `flag` points at that
        // Mapping's live `poisoned`, and [start, end) is its mapping. The page holding `addr`
        // lies inside that mapping (start is page-aligned, and the kernel maps whole pages), so
        // MAP_FIXED replaces one page of our own read-only mapping with a private zero page and
        // nothing else; no Rust reference points into a mapping (copies use raw pointers), and
        // a poisoned mapping's bytes are never used.
        unsafe {
            (*flag).store(true, Ordering::SeqCst);
            let zero = libc::mmap(
                (addr & !(page - 1)) as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            zero != libc::MAP_FAILED
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;

    use super::Mapping;

    pub(super) fn map(_file: &File, _offset: u64, _len: u64) -> Option<Mapping> {
        None
    }

    pub(super) fn guarded_copy(_m: &Mapping, _start: usize, _out: &mut [u8]) -> bool {
        unreachable!("nothing is mapped on this platform")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    #[test]
    fn copies_match_the_file_and_out_of_range_is_refused() {
        let t = TempDir::new("mapped");
        let bytes: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7 % 251) as u8).collect();
        let p = t.file("a", &bytes);
        let f = File::open(&p).unwrap();
        let m = Mapping::new(&f, 0, bytes.len() as u64).expect("mapping");
        let mut out = vec![0u8; 5000];
        assert!(m.copy_to(1234, &mut out));
        assert_eq!(out, bytes[1234..6234]);
        assert!(!m.copy_to(bytes.len() as u64 - 10, &mut out));
        assert!(!m.copy_to(u64::MAX, &mut out));
        assert!(!m.poisoned());
    }

    #[test]
    fn a_fault_past_a_truncation_poisons_instead_of_killing() {
        let t = TempDir::new("mapped-fault");
        let bytes = vec![7u8; 8 * 4096];
        let p = t.file("a", &bytes);
        let f = File::open(&p).unwrap();
        let m = Mapping::new(&f, 0, bytes.len() as u64).expect("mapping");
        let mut out = vec![0u8; 4096];
        assert!(m.copy_to(6 * 4096, &mut out));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(2 * 4096)
            .unwrap();
        // Inside what is left: still fine. Past it: the fault is absorbed and reported.
        assert!(m.copy_to(4096, &mut out));
        assert!(!m.copy_to(5 * 4096, &mut out));
        assert!(m.poisoned());
        assert!(
            !m.copy_to(0, &mut out),
            "a poisoned mapping is never read again"
        );
        // A second mapping of the same file still works, and sees the new length.
        let m2 = Mapping::new(&f, 0, 2 * 4096).expect("mapping");
        assert!(m2.copy_to(0, &mut out));
        assert_eq!(out, vec![7u8; 4096]);
    }

    #[test]
    fn a_fault_inside_a_piecewise_copy_poisons_too() {
        // A destination 16 bytes past the page-aligned source: the copy goes in 1 KiB pieces
        // (aligned.rs copy_bytes), and a fault in a later piece is absorbed the same way.
        let t = TempDir::new("mapped-fault-pieces");
        let bytes: Vec<u8> = (0..8 * 4096).map(|i| (i % 251) as u8).collect();
        let p = t.file("a", &bytes);
        let f = File::open(&p).unwrap();
        let m = Mapping::new(&f, 0, bytes.len() as u64).expect("mapping");
        let mut buf = crate::io::AlignedVec::<u8>::zeroed(4 * 4096).unwrap();
        let at = (16 + 4096 - buf.as_ptr() as usize % 4096) % 4096;
        let out = &mut buf[at..at + 2 * 4096];
        assert_eq!(out.as_ptr() as usize % 4096, 16);
        let x86_gnu = cfg!(all(target_arch = "x86_64", target_env = "gnu"));
        let src = m.base.wrapping_add(4 * 4096); // only the address is used
        assert_eq!(crate::io::piecewise(src, out.as_ptr(), out.len()), x86_gnu);
        assert!(m.copy_to(4 * 4096, out));
        assert_eq!(out, &bytes[4 * 4096..6 * 4096]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(5 * 4096)
            .unwrap();
        // The first 4 KiB (four pieces) are still there; the fault comes in the fifth.
        assert!(!m.copy_to(4 * 4096, out));
        assert!(m.poisoned());
        assert_eq!(&out[..4096], &bytes[4 * 4096..5 * 4096]);
    }

    #[test]
    fn a_range_mapping_copies_by_file_offset_and_refuses_outside_it() {
        let t = TempDir::new("mapped-range");
        let bytes: Vec<u8> = (0..10 * 4096 + 300).map(|i| (i * 13 % 251) as u8).collect();
        let p = t.file("a", &bytes);
        let f = File::open(&p).unwrap();
        // [5000, 5000 + 3 * 4096 + 7): mapped from the page at 4096.
        let (off, len) = (5000u64, 3 * 4096 + 7);
        let m = Mapping::new(&f, off, len).expect("mapping");
        assert_eq!((m.file_offset, m.len), (4096, 904 + 3 * 4096 + 7));
        let mut out = vec![0u8; 3000];
        for at in [5000u64, 5001, 6000, off + len - 3000, 4096] {
            assert!(m.copy_to(at, &mut out), "{at}");
            assert_eq!(out, bytes[at as usize..at as usize + 3000], "{at}");
        }
        assert!(!m.copy_to(4095, &mut out), "before the mapped page");
        assert!(
            !m.copy_to(off + len - 2999, &mut out),
            "past the mapped range"
        );
        assert!(!m.copy_to(u64::MAX, &mut out));
        assert!(Mapping::new(&f, 7, 0).is_none(), "nothing to map");
        assert!(Mapping::new(&f, u64::MAX, 2).is_none(), "overflows");
        // A range starting on a page boundary maps from there.
        let m = Mapping::new(&f, 8192, 100).expect("mapping");
        assert_eq!((m.file_offset, m.len), (8192, 100));
        let mut out = vec![0u8; 100];
        assert!(m.copy_to(8192, &mut out));
        assert_eq!(out, bytes[8192..8292]);
        assert!(!m.poisoned());
    }

    #[test]
    fn a_fault_in_a_range_mapping_poisons_instead_of_killing() {
        let t = TempDir::new("mapped-range-fault");
        let bytes: Vec<u8> = (0..16 * 4096).map(|i| (i % 249) as u8).collect();
        let p = t.file("a", &bytes);
        let f = File::open(&p).unwrap();
        let m = Mapping::new(&f, 6 * 4096 + 100, 8 * 4096).expect("mapping");
        let mut out = vec![0u8; 4096];
        assert!(m.copy_to(12 * 4096, &mut out));
        assert_eq!(out, bytes[12 * 4096..13 * 4096]);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(9 * 4096)
            .unwrap();
        assert!(m.copy_to(7 * 4096, &mut out), "inside what is left");
        assert!(!m.copy_to(10 * 4096, &mut out), "past the cut: absorbed");
        assert!(m.poisoned());
        assert!(!m.copy_to(7 * 4096, &mut out));
    }
}
