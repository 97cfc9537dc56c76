//! Cooperative cancellation of a generation run (Ctrl-C in the CLI).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared flag: generation loops check it once per step and, when it is set, stop with
/// every unfinished sequence marked cancelled (finished ones keep their text).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests cancellation (safe from a signal handler thread).
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_flag() {
        let a = CancelToken::new();
        let b = a.clone();
        assert!(!b.is_cancelled());
        a.cancel();
        assert!(b.is_cancelled());
    }
}
