//! Tensors' memory through DLPack, the one `unsafe` boundary of the package: a
//! `dltensor` capsule (what `torch.Tensor.__dlpack__()` returns, and every array
//! library's equivalent) is read, checked to be a contiguous CPU tensor of a spec dtype
//! and viewed in place. The capsule is kept, unconsumed, for as long as the view lives:
//! its destructor, not this module, gives the producer's tensor back. Blocks go the
//! other way: memory this module allocated is handed out as a `dltensor` capsule that
//! frees it when its consumer (or, unconsumed, the capsule) lets it go.

#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::os::raw::c_int;

use featshard_spec::ir::DType;
use memmap2::MmapMut;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use pyo3::{ffi, PyErr};

/// DLPack's `DLDevice`.
#[repr(C)]
struct DLDevice {
    device_type: c_int,
    device_id: c_int,
}

/// DLPack's `DLDataType`.
#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: c_int,
    dtype: DLDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensor`.
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const CAPSULE: &CStr = c"dltensor";
const CPU: c_int = 1;

fn dtype_of(t: &DLDataType) -> Option<DType> {
    let d = match (t.code, t.bits) {
        (6, 8) => DType::Bool,
        (1, 8) => DType::Uint8,
        (0, 8) => DType::Int8,
        (0, 16) => DType::Int16,
        (0, 32) => DType::Int32,
        (0, 64) => DType::Int64,
        (2, 16) => DType::Float16,
        (4, 16) => DType::Bfloat16,
        (2, 32) => DType::Float32,
        (2, 64) => DType::Float64,
        _ => return None,
    };
    (t.lanes == 1).then_some(d)
}

/// A contiguous CPU tensor's memory, kept alive by its capsule.
#[derive(Debug)]
pub(crate) struct Memory {
    ptr: *mut u8,
    len: usize,
    /// The element dtype.
    pub dtype: DType,
    /// The shape.
    pub shape: Vec<usize>,
    _capsule: Py<PyCapsule>,
    /// The producer's storage (a `torch.UntypedStorage`), asked before every read
    /// whether it still holds this memory: a tensor resized or freed since it was
    /// viewed has moved or lost it, and is refused instead of read.
    storage: Option<Py<PyAny>>,
}

// SAFETY: the memory is a CPU buffer the capsule keeps alive; nothing in it is tied to
// the thread that made it. Who writes when is the callers' contract (see `bytes_mut`).
unsafe impl Send for Memory {}
// SAFETY: shared access only reads (see above).
unsafe impl Sync for Memory {}

impl Memory {
    /// Views the tensor of `capsule` (feature `name` in messages).
    pub(crate) fn new(name: &str, capsule: &Bound<'_, PyCapsule>) -> PyResult<Memory> {
        let head = capsule.pointer_checked(Some(CAPSULE))?;
        // SAFETY: a live `dltensor` capsule points at a `DLManagedTensor`, whose first
        // member is the `DLTensor`; the producer keeps it valid until its deleter runs,
        // which only the capsule's destructor does (it is never consumed here).
        let t = unsafe { &(*head.as_ptr().cast::<DLManagedTensor>()).dl_tensor };
        let refuse = |why: String| PyValueError::new_err(format!("feature `{name}`: {why}"));
        if t.device.device_type != CPU {
            return Err(refuse(format!(
                "its tensor is on DLPack device type {} (id {}); the executor reads CPU memory",
                t.device.device_type, t.device.device_id
            )));
        }
        let dtype = dtype_of(&t.dtype).ok_or_else(|| {
            refuse(format!(
                "DLPack dtype code {} with {} bits is not a spec dtype",
                t.dtype.code, t.dtype.bits
            ))
        })?;
        let ndim = usize::try_from(t.ndim).map_err(|_| refuse("negative ndim".into()))?;
        // SAFETY: `shape` holds `ndim` entries, and `strides` too when not null.
        let dims = unsafe { raw_slice(t.shape, ndim) };
        let strides = unsafe { raw_slice(t.strides, if t.strides.is_null() { 0 } else { ndim }) };
        let shape: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
        let len = shape.iter().product::<usize>() * featshard_exec::dtype::size(dtype);
        if len > 0 && !strides.is_empty() && !is_row_major(&shape, strides) {
            return Err(refuse("its tensor is not contiguous".into()));
        }
        let ptr = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            // SAFETY: the producer's data pointer plus its byte offset is the first element.
            unsafe { t.data.cast::<u8>().add(t.byte_offset as usize) }
        };
        Ok(Memory {
            ptr,
            len,
            dtype,
            shape,
            _capsule: capsule.clone().unbind(),
            storage: None,
        })
    }

    /// Checks this memory against `storage` (an object with `data_ptr()` and
    /// `nbytes()`, the storage of the tensor the capsule came from) now and before
    /// every later read ([`Memory::check_alive`]).
    pub(crate) fn with_storage(
        mut self,
        name: &str,
        storage: Bound<'_, PyAny>,
    ) -> PyResult<Memory> {
        let py = storage.py();
        self.storage = Some(storage.unbind());
        self.check_alive(py, name)?;
        Ok(self)
    }

    /// `Err` naming `name` when the producer's storage no longer holds this memory (the
    /// tensor was resized, or its storage freed or swapped, since it was viewed). The
    /// interpreter's lock, held by the caller, keeps it so until the read is done.
    pub(crate) fn check_alive(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let Some(storage) = &self.storage else {
            return Ok(());
        };
        let storage = storage.bind(py);
        let ptr: usize = storage.call_method0("data_ptr")?.extract()?;
        let nbytes: usize = storage.call_method0("nbytes")?.extract()?;
        let at = self.ptr as usize;
        let inside = self.len == 0 || (ptr <= at && at + self.len <= ptr.saturating_add(nbytes));
        if inside {
            return Ok(());
        }
        Err(PyValueError::new_err(format!(
            "feature `{name}`: its tensor was resized or its storage freed after the sample was placed; place the sample again"
        )))
    }

    /// The tensor's bytes, row-major, for as long as the caller keeps `self`.
    ///
    /// # Safety
    /// The slice must not be used once `self` is dropped; the tensor must not be
    /// written or resized while it is (the contract `Placement` documents).
    pub(crate) unsafe fn bytes_unbound(&self) -> &'static [u8] {
        // SAFETY: `len` bytes at `ptr` belong to the tensor the capsule keeps alive.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The tensor's bytes, read within one call that holds `self` (the tensor is not
    /// written while Python waits on the call).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` belong to the tensor the capsule, held by
        // `self`, keeps alive; the slice cannot outlive `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The tensor's bytes to write: memory allocated for a block, which the one caller
    /// has checked (`overlaps`) that no other view of this crate reads or writes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes_unbound`; exclusive through `&mut self` and the caller's
        // overlap check against every other view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Whether the two tensors share any byte.
    pub(crate) fn overlaps(&self, other: &Memory) -> bool {
        let (a, b) = (self.ptr as usize, other.ptr as usize);
        self.len > 0 && other.len > 0 && a < b + other.len && b < a + self.len
    }
}

/// # Safety
/// `ptr` points at `n` readable `i64`s, or `n` is 0.
unsafe fn raw_slice<'a>(ptr: *const i64, n: usize) -> &'a [i64] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr, n) }
}

/// Strides (in elements) of a row-major tensor; axes of length 1 may have any stride.
fn is_row_major(shape: &[usize], strides: &[i64]) -> bool {
    let mut expected = 1i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected *= n as i64;
    }
    true
}

/// Memory allocated for blocks: anonymous pages advised as huge pages, so that writing
/// gigabytes of blocks takes hundreds of times fewer page faults than 4 KiB pages do;
/// recycled once its tensors are gone (`pool`).
pub(crate) struct Buffer {
    map: Option<MmapMut>,
    len: usize,
}

impl Buffer {
    /// `len` bytes for a caller that writes every one of them: recycled memory keeps
    /// its old bytes until then.
    pub(crate) fn new(len: usize) -> std::io::Result<Buffer> {
        let (map, _) = crate::pool::take(len)?;
        Ok(Buffer {
            map: Some(map),
            len,
        })
    }

    /// The buffer's bytes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.map {
            Some(map) => &mut map[..self.len],
            None => &mut [],
        }
    }

    /// The buffer as a one-dimensional uint8 `dltensor` capsule, which owns it.
    pub(crate) fn into_capsule(mut self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let data = self.bytes_mut().as_mut_ptr().cast::<c_void>();
        let exported = Box::into_raw(Box::new(Exported {
            managed: DLManagedTensor {
                dl_tensor: DLTensor {
                    data,
                    device: DLDevice {
                        device_type: CPU,
                        device_id: 0,
                    },
                    ndim: 1,
                    dtype: DLDataType {
                        code: 1,
                        bits: 8,
                        lanes: 1,
                    },
                    shape: std::ptr::null(),
                    strides: std::ptr::null(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(free_exported),
            },
            shape: [self.len as i64],
            _buffer: self,
        }));
        // SAFETY: `exported` is a live box; its shape array moves no more.
        unsafe { (*exported).managed.dl_tensor.shape = (*exported).shape.as_ptr() };
        // SAFETY: the capsule points at the `DLManagedTensor` heading the box; its
        // destructor frees the box unless a consumer took it (and its deleter) over.
        let capsule =
            unsafe { ffi::PyCapsule_New(exported.cast(), CAPSULE.as_ptr(), Some(drop_unconsumed)) };
        if capsule.is_null() {
            // SAFETY: no capsule was made: the box is still ours alone.
            unsafe { free_exported(exported.cast()) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `PyCapsule_New` returned a new reference.
        Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            crate::pool::give_back(map);
        }
    }
}

/// A `DLManagedTensor` and what it points at, in one box.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: [i64; 1],
    _buffer: Buffer,
}

/// The exported tensor's deleter: frees the box (and so the buffer).
unsafe extern "C" fn free_exported(m: *mut DLManagedTensor) {
    // SAFETY: `m` heads an `Exported` made by `Buffer::into_capsule`, freed once: by
    // its consumer through this deleter, or by `drop_unconsumed`, never both.
    drop(unsafe { Box::from_raw(m.cast::<Exported>()) });
}

/// The capsule's destructor: a capsule no consumer renamed still owns its tensor.
unsafe extern "C" fn drop_unconsumed(capsule: *mut ffi::PyObject) {
    // SAFETY: called by the interpreter with the capsule being destroyed.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*m).deleter {
                deleter(m);
            }
        }
    }
}
