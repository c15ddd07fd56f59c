//! A lock that cannot hang a forked child: the library's locks are taken in the
//! tenant's threads, some across a driver call (a primary context's retain takes
//! 100 ms and more), and `fork()` in another thread copies a held lock into a child
//! where no thread will ever release it.
//!
//! A [`ForkLock`] registers itself the first time it is taken; a `pthread_atfork`
//! child handler (installed with the first registration) marks every lock that was
//! held at the fork as abandoned. The data behind an abandoned lock may be halfway
//! through a change, so it is never touched again: [`ForkLock::lock`] returns
//! [`Abandoned`] in the child, and the hooks treat that as they treat a poisoned lock
//! (they forward to the driver, which refuses CUDA work in a forked child anyway).
//! A lock that was free at the fork works in the child as in the parent.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

const FREE: u32 = 0;
const HELD: u32 = 1;
const ABANDONED: u32 = 2;

/// The lock was held by another thread when this process was forked from its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned;

/// A mutual-exclusion lock over `T` that a forked child finds free or abandoned,
/// never held forever (see the module docs).
pub struct ForkLock<T> {
    state: AtomicU32,
    registered: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `state` (one guard at a time), as in
// std's Mutex.
unsafe impl<T: Send> Sync for ForkLock<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for ForkLock<T> {}

/// Access to a [`ForkLock`]'s value; releases the lock when dropped.
pub struct ForkGuard<'a, T> {
    lock: &'a ForkLock<T>,
}

impl<T> ForkLock<T> {
    pub const fn new(value: T) -> Self {
        ForkLock {
            state: AtomicU32::new(FREE),
            registered: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }
}

impl<T: 'static> ForkLock<T> {
    /// Takes the lock, waiting (spinning, then yielding, then sleeping 20 µs at a
    /// time) while another thread holds it; `Err(Abandoned)` in a forked child when
    /// the lock was held at the fork.
    pub fn lock(&'static self) -> Result<ForkGuard<'static, T>, Abandoned> {
        if !self.registered.load(Ordering::Acquire) {
            register(self);
        }
        let mut tries = 0u32;
        loop {
            match self
                .state
                .compare_exchange_weak(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Ok(ForkGuard { lock: self }),
                Err(ABANDONED) => return Err(Abandoned),
                Err(_) => {}
            }
            tries = tries.saturating_add(1);
            if tries < 64 {
                std::hint::spin_loop();
            } else if tries < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }
}

impl<T> Deref for ForkGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for ForkGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for ForkGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.state.store(FREE, Ordering::Release);
    }
}

/// Room for every lock the library has (a few tables and the settling stripes).
const MAX_LOCKS: usize = 64;
static LOCKS: [AtomicPtr<AtomicU32>; MAX_LOCKS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_LOCKS];
static NLOCKS: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();

#[cold]
fn register<T>(l: &'static ForkLock<T>) {
    INSTALL.call_once(|| {
        // SAFETY: registers a child handler that only touches atomics.
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
    if l.registered
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let i = NLOCKS.fetch_add(1, Ordering::AcqRel);
    if let Some(slot) = LOCKS.get(i) {
        slot.store((&l.state as *const AtomicU32).cast_mut(), Ordering::Release);
    }
}

/// The child side of `fork()`: only the forking thread lives on, so a lock held now
/// is held by a thread that no longer exists.
extern "C" fn in_child() {
    let n = NLOCKS.load(Ordering::Acquire).min(MAX_LOCKS);
    for slot in &LOCKS[..n] {
        let p = slot.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: registered pointers are to the `state` of `'static` locks.
            let state = unsafe { &*p };
            let _ = state.compare_exchange(HELD, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static COUNTER: ForkLock<u64> = ForkLock::new(0);
    static HELD_AT_FORK: ForkLock<u64> = ForkLock::new(0);

    /// Eight threads incrementing through the lock lose no update.
    #[test]
    fn the_lock_excludes() {
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        if let Ok(mut g) = COUNTER.lock() {
                            *g += 1;
                        }
                    }
                });
            }
        });
        assert_eq!(COUNTER.lock().map(|g| *g), Ok(80_000));
    }

    /// A lock another thread holds at fork() is abandoned in the child (taking it
    /// returns at once), while the parent gets it back when the thread lets go.
    #[test]
    fn a_lock_held_at_fork_is_abandoned_in_the_child() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let g = HELD_AT_FORK.lock();
            let _ = tx.send(());
            let _ = done_rx.recv();
            drop(g);
        });
        let _ = rx.recv();
        // SAFETY: the child only takes the lock (atomics) and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = if HELD_AT_FORK.lock().is_err() { 0 } else { 1 };
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let _ = done_tx.send(());
        let _ = holder.join();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        assert!(HELD_AT_FORK.lock().is_ok(), "the parent still has it");
    }
}
