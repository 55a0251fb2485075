//! Keeping a question to a person readable: whatever the front end draws on
//! the terminal (a progress bar) is hidden while the engine asks for a
//! passphrase or a host-key answer, and shown again after.
//!
//! The front end registers what it draws with [`hide_while_prompting`]; the
//! engine wraps each question in [`while_prompting`]. Questions are already
//! asked one at a time, so one registration at a time is enough. Lines the
//! front end prints as work finishes (a host's report) go through
//! [`print_outside_questions`], which holds them back while a question is
//! open and prints them, in order, once it is answered.

use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// Something drawn on the terminal that can step aside for a question.
pub trait TerminalDrawing: Send + Sync {
    /// Clears what is drawn and draws nothing more until [`Self::show`].
    fn hide(&self);
    /// Draws again.
    fn show(&self);
}

type Registered = Option<Arc<dyn TerminalDrawing>>;

static DRAWING: RwLock<Registered> = RwLock::new(None);

fn registered() -> Registered {
    DRAWING
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

fn register(drawing: Registered) -> Registered {
    let mut slot = DRAWING.write().unwrap_or_else(PoisonError::into_inner);
    std::mem::replace(&mut slot, drawing)
}

/// Hides `drawing` during every question the engine asks until the returned
/// guard is dropped (which puts back what was registered before).
#[must_use = "the drawing is only hidden during questions while the guard lives"]
pub fn hide_while_prompting(drawing: Arc<dyn TerminalDrawing>) -> Registration {
    Registration {
        previous: register(Some(drawing)),
    }
}

/// Keeps a drawing registered; see [`hide_while_prompting`].
pub struct Registration {
    previous: Registered,
}

impl Drop for Registration {
    fn drop(&mut self) {
        register(self.previous.take());
    }
}

/// Printing held back until the open question is answered.
type Held = Vec<Box<dyn FnOnce() + Send>>;

/// `Some` while a question is open.
static HELD: Mutex<Option<Held>> = Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<Held>> {
    HELD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `print` now or, while the engine is asking a person something, as
/// soon as the question is answered, so that nothing lands in the middle of
/// a question. What was held back runs in the order it came.
pub fn print_outside_questions(print: impl FnOnce() + Send + 'static) {
    let mut held = held();
    match held.as_mut() {
        Some(queue) => queue.push(Box::new(print)),
        // Under the lock: a question cannot start halfway through.
        None => print(),
    }
}

/// Runs `ask` (which talks to a person) with the registered drawing hidden
/// and printing held back (see [`print_outside_questions`]).
pub(crate) fn while_prompting<R>(ask: impl FnOnce() -> R) -> R {
    /// Shows the drawing again and prints what was held back, even if
    /// `ask` panics.
    struct Shown(Registered);
    impl Drop for Shown {
        fn drop(&mut self) {
            if let Some(drawing) = &self.0 {
                drawing.show();
            }
            let mut held = held();
            for print in held.take().into_iter().flatten() {
                print();
            }
        }
    }
    held().get_or_insert_with(Vec::new);
    let shown = Shown(registered());
    if let Some(drawing) = &shown.0 {
        drawing.hide();
    }
    ask()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<&'static str>>);

    impl TerminalDrawing for Log {
        fn hide(&self) {
            self.0.lock().unwrap().push("hide");
        }
        fn show(&self) {
            self.0.lock().unwrap().push("show");
        }
    }

    /// One test touches the process-wide registration, so that no other
    /// test's drawing is seen.
    #[test]
    fn a_question_hides_the_drawing_and_shows_it_again() {
        assert_eq!(while_prompting(|| 1), 1);
        let log = Arc::new(Log::default());
        {
            let _guard = hide_while_prompting(log.clone());
            let during = while_prompting(|| log.0.lock().unwrap().clone());
            assert_eq!(during, vec!["hide"]);
            assert_eq!(*log.0.lock().unwrap(), vec!["hide", "show"]);
            // Shown again after a panic too.
            let caught = std::panic::catch_unwind(|| while_prompting(|| panic!("no answer")));
            assert!(caught.is_err());
            assert_eq!(log.0.lock().unwrap().len(), 4);
        }
        // Dropped: questions leave it alone.
        while_prompting(|| ());
        assert_eq!(log.0.lock().unwrap().len(), 4);

        // Printing waits for the question and keeps its order; outside a
        // question it happens at once.
        let printed = Arc::new(Mutex::new(Vec::new()));
        let print = |line: &'static str| {
            let printed = printed.clone();
            move || printed.lock().unwrap().push(line)
        };
        print_outside_questions(print("before"));
        let during = while_prompting(|| {
            print_outside_questions(print("first"));
            print_outside_questions(print("second"));
            printed.lock().unwrap().clone()
        });
        assert_eq!(during, vec!["before"]);
        print_outside_questions(print("after"));
        assert_eq!(
            *printed.lock().unwrap(),
            vec!["before", "first", "second", "after"]
        );
        // And after a question that panicked.
        let caught = std::panic::catch_unwind(|| {
            while_prompting(|| {
                print_outside_questions(print("held"));
                panic!("no answer")
            })
        });
        assert!(caught.is_err());
        assert_eq!(printed.lock().unwrap().last(), Some(&"held"));
    }
}
