//! A file memory-mapped read-only, and its resident pages given back once read
//! (`madvise(MADV_DONTNEED)`), so that a large input leaves memory as its rank files
//! are written. The crate's one boundary with the OS's memory maps.
//!
//! A file truncated by another process while it is mapped makes reads past its new end
//! raise SIGBUS, which would kill the process mid-write. Every mapping is guarded: a
//! SIGBUS inside a live mapping puts a page of zeros where the file's page was and marks
//! the mapping, and [`Mapping::check_unchanged`] (which the writers call before an
//! output is put in place) reports it, with any other change to the file since it was
//! opened (its size, modification or status-change time), as an error naming it.
//! Nothing read from a changed file is kept.

#![allow(unsafe_code)]

use std::fs::File;
use std::marker::PhantomData;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use memmap2::{Mmap, UncheckedAdvice};

/// One file mapped whole, read-only.
#[derive(Debug)]
pub struct Mapping {
    // Declared first: the guard is released before the map is unmapped.
    guard: Guard,
    map: Mmap,
    file: File,
    opened: Stamp,
}

/// What identifies a file's contents without reading them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(file: &File) -> std::io::Result<Stamp> {
        let m = file.metadata()?;
        Ok(Stamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

impl Mapping {
    /// Maps `file`, guarded against SIGBUS (see the module's notes).
    pub fn open(file: File) -> std::io::Result<Mapping> {
        let opened = Stamp::of(&file)?;
        // SAFETY: the map is read-only and private to this process. A file truncated by
        // another process while mapped raises SIGBUS on reads past its end: the guard
        // below turns that into a page of zeros and a mark that `check_unchanged`
        // reports. Other changes are caught by the file's stamp.
        let map = unsafe { memmap2::MmapOptions::new().map(&file)? };
        let guard = Guard::new(map.as_ptr() as usize, map.len())?;
        Ok(Mapping {
            guard,
            map,
            file,
            opened,
        })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file's size and modification time (seconds, nanoseconds) when opened.
    pub fn opened(&self) -> (u64, (i64, i64)) {
        (self.opened.len, self.opened.mtime)
    }

    /// `Err` (with what changed) when the file was truncated, written or replaced in
    /// place since it was opened: what was read from it may be neither what was
    /// validated nor what it holds now.
    pub fn check_unchanged(&self) -> Result<(), String> {
        if self.guard.hit() {
            return Err("it was truncated while it was read".into());
        }
        match Stamp::of(&self.file) {
            Ok(now) if now == self.opened => Ok(()),
            Ok(now) if now.len != self.opened.len => Err(format!(
                "it changed while it was read ({} bytes when opened, {} now)",
                self.opened.len, now.len
            )),
            Ok(_) => Err("it was written to while it was read".into()),
            Err(e) => Err(format!("it cannot be checked after reading: {e}")),
        }
    }

    /// A handle that gives pages back, for any thread, while the mapping lives.
    pub fn pages(&self) -> Pages<'_> {
        Pages {
            map: &self.map,
            _alive: PhantomData,
        }
    }
}

/// Gives back resident pages of a live [`Mapping`].
#[derive(Clone, Copy, Debug)]
pub struct Pages<'a> {
    map: &'a Mmap,
    _alive: PhantomData<&'a ()>,
}

impl Pages<'_> {
    /// Gives back the resident whole pages of `bytes`, when they lie inside the mapping
    /// (bytes of any other memory are left alone: giving them back would lose data).
    pub fn release(&self, bytes: &[u8]) {
        let base = self.map.as_ptr() as usize;
        let at = bytes.as_ptr() as usize;
        let end = at.saturating_add(bytes.len());
        if at < base || end > base + self.map.len() {
            return;
        }
        let page = page_size();
        let (start, end) = (
            (at - base).next_multiple_of(page),
            (end - base) / page * page,
        );
        if start >= end {
            return;
        }
        // SAFETY: the range lies inside the mapping, which `Pages` borrows. It is a
        // read-only mapping of a file, so its pages are never dirty: dropping them loses
        // nothing, and the next read maps the same bytes in again from the file. No
        // reference into the range is invalidated (the memory stays mapped).
        unsafe {
            let _ = self
                .map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: `sysconf` with a valid name has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(1)
}

/// Mappings guarded at once (one per sample being read; `--jobs` samples at a time).
pub(crate) const SLOTS: usize = 256;

/// One guarded address range. Lock-free: the signal handler reads it.
struct Slot {
    taken: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    hit: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    taken: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    hit: AtomicBool::new(false),
};
static GUARDED: [Slot; SLOTS] = [FREE; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();
/// The SIGBUS disposition before ours, for faults outside every guarded range.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// A mapping's slot, released on drop.
#[derive(Debug)]
struct Guard {
    slot: Option<usize>,
}

impl Guard {
    fn new(start: usize, len: usize) -> std::io::Result<Guard> {
        if len == 0 {
            return Ok(Guard { slot: None });
        }
        install();
        let free = GUARDED.iter().position(|s| {
            s.taken
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        let Some(k) = free else {
            return Err(std::io::Error::other(format!(
                "more than {SLOTS} files mapped at once"
            )));
        };
        let s = &GUARDED[k];
        s.hit.store(false, Ordering::Release);
        s.end.store(start + len, Ordering::Release);
        s.start.store(start, Ordering::Release);
        Ok(Guard { slot: Some(k) })
    }

    fn hit(&self) -> bool {
        self.slot
            .is_some_and(|k| GUARDED[k].hit.load(Ordering::Acquire))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(k) = self.slot {
            let s = &GUARDED[k];
            s.start.store(0, Ordering::Release);
            s.end.store(0, Ordering::Release);
            s.taken.store(false, Ordering::Release);
        }
    }
}

/// Installs the SIGBUS handler once per process.
fn install() {
    INSTALL.call_once(|| {
        PAGE.store(page_size(), Ordering::Release);
        // SAFETY: a zeroed `sigaction` is a valid empty action; `sigaction` reads the
        // new action and writes the old one into memory owned here.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                on_sigbus;
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &action, &mut old) == 0 {
                let _ = PREVIOUS.set(old);
            }
        }
    });
}

/// A SIGBUS inside a guarded mapping: a page of zeros mapped over the faulting page
/// (the read then completes) and the mapping marked. Anywhere else: the previous
/// disposition. Uses only atomics and `mmap`/`sigaction`, which are safe here.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Acquire);
    for s in &GUARDED {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || addr < start || addr >= s.end.load(Ordering::Acquire) {
            continue;
        }
        let at = addr / page * page;
        // SAFETY: replaces one page of a live read-only file mapping of this process
        // with an anonymous read-only page; nothing else maps there.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            s.hit.store(true, Ordering::Release);
            return;
        }
    }
    previous(sig, info, ctx);
}

/// Hands a SIGBUS that is not ours to the disposition before ours; the default one is
/// restored, and the faulting read raises it again on return.
fn previous(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let old = PREVIOUS.get();
    let handler = old.map_or(libc::SIG_DFL, |o| o.sa_sigaction);
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
        let siginfo = old.is_some_and(|o| o.sa_flags & libc::SA_SIGINFO != 0);
        // SAFETY: `handler` is the function the process installed for SIGBUS, called
        // with the signature its flags declare.
        unsafe {
            if siginfo {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(handler);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                f(sig);
            }
        }
        return;
    }
    // SAFETY: a zeroed `sigaction` with SIG_DFL is the default action.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
    }
}
