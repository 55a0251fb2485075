//! How the C allocator treats freed memory in `skiff cp`.
//!
//! An SFTP copy allocates a buffer of up to 256 KiB for every read answer
//! or write request, thousands per GiB. With glibc's defaults a freed block
//! that large is handed back to the kernel (unmapped, or trimmed off the
//! top of the heap) and the next one is faulted in again, page by page,
//! zeroed by the kernel: measured on a 1 GiB download from a stock sshd on
//! loopback, 220,000 page faults and 3.9 s of CPU; with the settings below
//! 3,300 faults and 3.2 s (docs/BENCHMARKS.md). The data plane reuses its
//! buffers and is not affected.
//!
//! The cost is memory kept after a peak: up to [`TRIM_THRESHOLD`] of free
//! heap per allocator arena is not returned before the copy ends, which a
//! process that exits when its copy is done can afford. The long-lived
//! agent keeps glibc's defaults.

/// Blocks up to this size come from the heap, not from a mapping of their own.
#[cfg(target_env = "gnu")]
const MMAP_THRESHOLD: libc::c_int = 1 << 20;

/// Free memory at the top of a heap is given back only past this much.
#[cfg(target_env = "gnu")]
const TRIM_THRESHOLD: libc::c_int = 32 << 20;

/// Keeps freed copy buffers for reuse (see the module's text). Best
/// effort: glibc that refuses a setting keeps its default.
pub(crate) fn keep_freed_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes glibc's malloc parameters, under the
    // allocator's own lock; the values are in the ranges glibc accepts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}
