//! The crate's unsafe code (with `mapping`'s one `madvise`): declarations of `csrc/c10d_shim.cpp` and thin
//! owners of its handles. Every function here checks the shim's error string and
//! frees it; callers above see `Result<_, String>`.

#![allow(unsafe_code)]

use std::ffi::{c_char, CStr, CString};
use std::ptr;

use tch::Tensor;
use torch_sys::C_tensor;

#[repr(C)]
struct RawStore {
    _private: [u8; 0],
}

#[repr(C)]
struct RawGroup {
    _private: [u8; 0],
}

extern "C" {
    fn fs_string_free(s: *mut c_char);
    fn fs_tensor_sole_owner(t: *const C_tensor) -> bool;
    fn fs_tcp_store(
        host: *const c_char,
        port: u16,
        is_server: bool,
        world_size: i32,
        timeout_ms: i64,
        out: *mut *mut RawStore,
    ) -> *mut c_char;
    fn fs_hash_store(out: *mut *mut RawStore) -> *mut c_char;
    fn fs_prefix_store(
        prefix: *const c_char,
        base: *const RawStore,
        out: *mut *mut RawStore,
    ) -> *mut c_char;
    fn fs_store_clone(s: *const RawStore, out: *mut *mut RawStore) -> *mut c_char;
    fn fs_store_free(s: *mut RawStore);
    fn fs_gloo_group(
        s: *const RawStore,
        rank: i32,
        size: i32,
        hostname: *const c_char,
        timeout_ms: i64,
        out: *mut *mut RawGroup,
    ) -> *mut c_char;
    fn fs_nccl_compiled() -> bool;
    fn fs_nccl_group(
        s: *const RawStore,
        rank: i32,
        size: i32,
        device: i32,
        timeout_ms: i64,
        out: *mut *mut RawGroup,
    ) -> *mut c_char;
    fn fs_group_free(g: *mut RawGroup);
    fn fs_broadcast(g: *mut RawGroup, t: *mut C_tensor, root: i32) -> *mut c_char;
    fn fs_scatter(
        g: *mut RawGroup,
        out: *mut C_tensor,
        inputs: *const *mut C_tensor,
        n_inputs: usize,
        root: i32,
    ) -> *mut c_char;
    fn fs_all_gather(
        g: *mut RawGroup,
        outs: *const *mut C_tensor,
        n_outs: usize,
        input: *mut C_tensor,
    ) -> *mut c_char;
    fn fs_all_reduce(g: *mut RawGroup, t: *mut C_tensor, op: i32) -> *mut c_char;
    fn fs_barrier(g: *mut RawGroup) -> *mut c_char;
}

/// Turns the shim's error string into a `Result`, freeing it.
fn check(err: *mut c_char) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: the shim returns either NULL or a NUL-terminated malloc'd string that
    // it hands over to us; it is read once and freed once.
    let msg = unsafe { CStr::from_ptr(err) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: see above; `err` is not used after this.
    unsafe { fs_string_free(err) };
    Err(msg)
}

fn c_string(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} contains a NUL byte"))
}

/// A c10d store (`TCPStore`, `HashStore` or a `PrefixStore` over one).
pub struct Store(*mut RawStore);

// SAFETY: c10d stores are internally synchronised (HashStore locks, TCPStore talks to a
// server); the handle is an intrusive_ptr that may be used from any thread.
unsafe impl Send for Store {}
// SAFETY: as above, every store operation is thread-safe.
unsafe impl Sync for Store {}

impl Store {
    pub fn tcp(
        host: &str,
        port: u16,
        is_server: bool,
        world_size: usize,
        timeout_ms: i64,
    ) -> Result<Store, String> {
        let host = c_string(host)?;
        let world = i32::try_from(world_size).map_err(|_| "world size too large".to_owned())?;
        let mut out = ptr::null_mut();
        // SAFETY: `host` outlives the call; `out` is written only on success.
        check(unsafe {
            fs_tcp_store(host.as_ptr(), port, is_server, world, timeout_ms, &mut out)
        })?;
        Ok(Store(out))
    }

    pub fn hash() -> Result<Store, String> {
        let mut out = ptr::null_mut();
        // SAFETY: `out` is written only on success.
        check(unsafe { fs_hash_store(&mut out) })?;
        Ok(Store(out))
    }

    /// Keys of the new store are `prefix/key` in this one.
    pub fn prefixed(&self, prefix: &str) -> Result<Store, String> {
        let prefix = c_string(prefix)?;
        let mut out = ptr::null_mut();
        // SAFETY: `self.0` is a live handle; `prefix` outlives the call.
        check(unsafe { fs_prefix_store(prefix.as_ptr(), self.0, &mut out) })?;
        Ok(Store(out))
    }

    /// Another handle to the same store.
    pub fn share(&self) -> Result<Store, String> {
        let mut out = ptr::null_mut();
        // SAFETY: `self.0` is a live handle.
        check(unsafe { fs_store_clone(self.0, &mut out) })?;
        Ok(Store(out))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the handle was created by the shim and is dropped once.
        unsafe { fs_store_free(self.0) }
    }
}

/// Whether `t` is the only tensor referring to its memory (see the shim).
pub fn sole_owner(t: &Tensor) -> bool {
    // SAFETY: `t` wraps a live `at::Tensor*`, which the shim only reads.
    unsafe { fs_tensor_sole_owner(t.as_ptr()) }
}

pub fn nccl_compiled() -> bool {
    // SAFETY: no arguments, no state.
    unsafe { fs_nccl_compiled() }
}

/// A c10d backend (one process group) of this rank.
pub struct Group(*mut RawGroup);

// SAFETY: a backend may move between threads; `Group` is not `Sync`, so its
// collectives are issued from one thread at a time, as c10d requires.
unsafe impl Send for Group {}

fn ptr_of(t: &Tensor) -> *mut C_tensor {
    // The shim copies the at::Tensor handle (a refcount) and never frees it.
    t.as_ptr() as *mut C_tensor
}

impl Group {
    pub fn gloo(
        store: &Store,
        rank: usize,
        size: usize,
        hostname: &str,
        timeout_ms: i64,
    ) -> Result<Group, String> {
        let host = c_string(hostname)?;
        let mut out = ptr::null_mut();
        // SAFETY: live store handle; `host` outlives the call.
        check(unsafe {
            fs_gloo_group(
                store.0,
                rank as i32,
                size as i32,
                host.as_ptr(),
                timeout_ms,
                &mut out,
            )
        })?;
        Ok(Group(out))
    }

    pub fn nccl(
        store: &Store,
        rank: usize,
        size: usize,
        device: usize,
        timeout_ms: i64,
    ) -> Result<Group, String> {
        let mut out = ptr::null_mut();
        // SAFETY: live store handle.
        check(unsafe {
            fs_nccl_group(
                store.0,
                rank as i32,
                size as i32,
                device as i32,
                timeout_ms,
                &mut out,
            )
        })?;
        Ok(Group(out))
    }

    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<(), String> {
        // SAFETY: live group handle; the tensor outlives the (synchronous) call.
        check(unsafe { fs_broadcast(self.0, t.as_mut_ptr(), root as i32) })
    }

    pub fn scatter(&self, out: &mut Tensor, inputs: &[Tensor], root: usize) -> Result<(), String> {
        let ins: Vec<*mut C_tensor> = inputs.iter().map(ptr_of).collect();
        // SAFETY: live handles; every tensor outlives the synchronous call.
        check(unsafe {
            fs_scatter(
                self.0,
                out.as_mut_ptr(),
                ins.as_ptr(),
                ins.len(),
                root as i32,
            )
        })
    }

    pub fn all_gather(&self, outs: &mut [Tensor], input: &Tensor) -> Result<(), String> {
        let outs: Vec<*mut C_tensor> = outs.iter_mut().map(|t| t.as_mut_ptr()).collect();
        // SAFETY: live handles; the outputs are written in place through their handles.
        check(unsafe { fs_all_gather(self.0, outs.as_ptr(), outs.len(), ptr_of(input)) })
    }

    pub fn all_reduce(&self, t: &mut Tensor, op: i32) -> Result<(), String> {
        // SAFETY: live handles.
        check(unsafe { fs_all_reduce(self.0, t.as_mut_ptr(), op) })
    }

    pub fn barrier(&self) -> Result<(), String> {
        // SAFETY: live handle.
        check(unsafe { fs_barrier(self.0) })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: the handle was created by the shim and is dropped once.
        unsafe { fs_group_free(self.0) }
    }
}
