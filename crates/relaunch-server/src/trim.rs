//! Giving freed memory back to the system after heavy reads.
//!
//! glibc keeps what a thread frees in that thread's arena for reuse; after
//! a burst of large series reads the process would go on holding hundreds
//! of MiB it no longer uses. `malloc_trim(0)` returns the free pages of
//! every arena. It is called when the last heavy read in flight finishes
//! (`reads.rs`), not after every read: it walks the arenas, and while other
//! reads run, what it frees they would allocate again.

// The one call std and nix do not wrap is `malloc_trim`; the unsafe block
// below is that call, which takes and returns plain integers.
#![allow(unsafe_code)]

/// Returns the allocator's free memory to the system (glibc only; a no-op
/// elsewhere).
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim reads no memory of ours; glibc locks each arena
    // while it trims it, so it is safe beside other threads' allocations.
    unsafe {
        libc::malloc_trim(0);
    }
}
