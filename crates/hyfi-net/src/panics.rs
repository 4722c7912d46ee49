//! What a node whose program panics tells its peers: the panic's message
//! and place, kept by a panic hook, since the runtime learns of the panic
//! only as it unwinds past it (a link's `Drop`), when the payload is gone.

use std::sync::Mutex;

/// The last panic's message and place on this process (any thread).
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Keeps the message of every panic (then runs the hook that was there),
/// so that a node whose program panics can tell its peers why.
pub(crate) fn record_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = match info.payload().downcast_ref::<&str>() {
                Some(s) => (*s).to_string(),
                None => info
                    .payload()
                    .downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| "(a non-string payload)".into()),
            };
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{msg}{at}"));
            prev(info);
        }));
    });
}

/// The last panic's message and place, if this process panicked since
/// [`record_panics`].
pub(crate) fn last_panic() -> Option<String> {
    LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
