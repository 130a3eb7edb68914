//! The app's native manners: through tauri's mock runtime, the menu as built, its Run
//! items calling the bridge as the buttons do and the others asking the page, and the
//! run's views (through the real forwarder) keeping the machine awake and telling the
//! run's end; then the rules behind them, module by module (shortcut labels, when a
//! notice is due, the wake lock's states, the window's geometry, the menu's spec).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ostinato_app::bridge::{BridgeError, EngineRun};
use ostinato_app::native::awake::{Acquire, Hold};
use ostinato_app::native::menu::{self, Entry};
use ostinato_app::native::notice::Notice;
use ostinato_app::native::shortcuts::Platform;
use ostinato_app::native::watch;
use ostinato_app::AppState;
use ostinato_engine::events::Event;
use serde_json::{json, Value};
use tauri::test::{mock_builder, MockRuntime};
use tauri::{App, Listener, Manager};

fn mock_app(state: AppState) -> App<MockRuntime> {
    ostinato_app::app_builder(mock_builder(), state).build(tauri::generate_context!(test = true)).expect("mock app")
}

fn state(dir: &Path) -> AppState {
    AppState::new(dir.join("config"), dir.join("runs"))
}

/// The engine's run control as a recorder: what the bridge asked of it.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<&'static str>>>);
struct Scripted(PathBuf, Calls);
impl EngineRun for Scripted {
    fn pause(&self) -> Result<(), BridgeError> {
        self.1 .0.lock().unwrap().push("pause");
        Ok(())
    }
    fn resume(&self) -> Result<(), BridgeError> {
        self.1 .0.lock().unwrap().push("resume");
        Ok(())
    }
    fn stop(&self) -> Result<(), BridgeError> {
        self.1 .0.lock().unwrap().push("stop");
        Ok(())
    }
    fn run_dir(&self) -> PathBuf {
        self.0.clone()
    }
    fn generate(
        &self,
        _spec: ostinato_engine::generate::GenerateSpec,
        _out: PathBuf,
    ) -> Result<std::sync::mpsc::Receiver<ostinato_engine::train::songs::SongUpdate>, BridgeError> {
        self.1 .0.lock().unwrap().push("generate");
        // Never served: the channel closes, as when a run ends first.
        Ok(std::sync::mpsc::channel().1)
    }
}
impl Calls {
    fn get(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }
}

/// A run the test scripts: its events go in through the returned sender.
fn adopt(state: &AppState, app: &App<MockRuntime>, calls: &Calls) -> Sender<Event> {
    let (tx, rx) = channel();
    state.adopt_run(
        Box::new(Scripted(PathBuf::from("/runs/2026-12-02-song"), calls.clone())),
        rx,
        app.handle().clone(),
    );
    tx
}

/// The `menu` events the page gets.
fn page_events(app: &App<MockRuntime>) -> Arc<Mutex<Vec<Value>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    app.listen_any(menu::MENU_EVENT, move |e| s.lock().unwrap().push(serde_json::from_str(e.payload()).unwrap()));
    seen
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_built_menu_is_its_spec() {
    let dir = tempfile::tempdir().unwrap();
    let app = mock_app(state(dir.path()));
    let name = app.package_info().name.clone();
    let built = menu::build(app.handle()).expect("building the menu");
    let spec = menu::spec(&name, Platform::current());
    let subs = built.items().unwrap();
    assert_eq!(subs.len(), spec.len());
    for (kind, want) in subs.iter().zip(&spec) {
        let sub = kind.as_submenu().expect("a submenu");
        assert_eq!(sub.text().unwrap(), want.title);
        let items = sub.items().unwrap();
        assert_eq!(items.len(), want.entries.len(), "{}", want.title);
        for (item, entry) in items.iter().zip(&want.entries) {
            if let Entry::Item { id, text, .. } = entry {
                let item = item.as_menuitem().unwrap_or_else(|| panic!("{id} is an item"));
                assert_eq!((item.id().as_ref(), item.text().unwrap().as_str()), (*id, *text));
            } else {
                assert!(item.as_predefined_menuitem().is_some(), "{entry:?}");
            }
        }
    }
}

#[test]
fn run_items_pause_resume_and_stop_through_the_bridge() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let app = mock_app(state.clone());
    let page = page_events(&app);

    // No run: the bridge's refusal goes to the page, as a button's would.
    menu::on_menu(app.handle(), menu::PAUSE);
    wait_for("the refusal", || !page.lock().unwrap().is_empty());
    assert_eq!(page.lock().unwrap()[0], json!({"action": "error", "message": "no run is in progress"}));

    let calls = Calls::default();
    let _events = adopt(&state, &app, &calls);
    menu::on_menu(app.handle(), menu::PAUSE);
    assert_eq!(calls.get(), ["pause"]);
    assert_eq!(state.state().run.view.requested, Some(ostinato_app::bridge::Request::Pause));
    menu::on_menu(app.handle(), menu::RESUME);
    assert_eq!(calls.get(), ["pause", "resume"]);
    menu::on_menu(app.handle(), menu::STOP);
    assert_eq!(calls.get(), ["pause", "resume", "stop"]);
    assert_eq!(state.state().run.view.requested, Some(ostinato_app::bridge::Request::Stop));
    // Stopping: a pause is refused by the bridge, and told.
    menu::on_menu(app.handle(), menu::PAUSE);
    assert_eq!(calls.get(), ["pause", "resume", "stop"]);
    wait_for("the second refusal", || page.lock().unwrap().len() == 2);
    assert_eq!(page.lock().unwrap()[1], json!({"action": "error", "message": "the run is not running"}));
}

#[test]
fn page_items_ask_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let app = mock_app(state.clone());
    let page = page_events(&app);
    let calls = Calls::default();
    let _events = adopt(&state, &app, &calls);
    for id in [menu::SETTINGS, menu::OPEN_DATASET, menu::OPEN_MODEL, menu::START] {
        menu::on_menu(app.handle(), id);
    }
    wait_for("four page events", || page.lock().unwrap().len() == 4);
    let actions: Vec<Value> = page.lock().unwrap().iter().map(|v| v["action"].clone()).collect();
    assert_eq!(actions, [json!("settings"), json!("open_dataset"), json!("open_model"), json!("start")]);
    assert!(calls.get().is_empty(), "Start is the page's: it saves the form first");
}

/// Counts holds taken and released (dropped); refuses them when told to.
#[derive(Clone, Default)]
struct Holds {
    taken: Arc<AtomicUsize>,
    released: Arc<AtomicUsize>,
    refuse: bool,
}
struct Counted(Arc<AtomicUsize>);
impl Hold for Counted {}
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
impl Acquire for Holds {
    fn acquire(&mut self) -> Result<Box<dyn Hold>, String> {
        self.taken.fetch_add(1, Ordering::SeqCst);
        if self.refuse {
            return Err("no power service".into());
        }
        Ok(Box::new(Counted(self.released.clone())))
    }
}
impl Holds {
    fn counts(&self) -> (usize, usize) {
        (self.taken.load(Ordering::SeqCst), self.released.load(Ordering::SeqCst))
    }
}

#[test]
fn the_run_keeps_the_machine_awake_and_its_end_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let app = mock_app(state.clone());
    let holds = Holds::default();
    let told: Arc<Mutex<Vec<Notice>>> = Arc::default();
    let t = told.clone();
    let watch = watch::start_with(app.handle(), holds.clone(), move |_, n: &Notice| t.lock().unwrap().push(n.clone()));
    app.manage(watch.unwrap());

    let events = adopt(&state, &app, &Calls::default());
    wait_for("a hold while running", || holds.counts() == (1, 0));
    events.send(Event::Paused { step: 3 }).unwrap();
    wait_for("the hold released on pause", || holds.counts() == (1, 1));
    events.send(Event::Resumed { step: 3 }).unwrap();
    wait_for("a hold again on resume", || holds.counts() == (2, 1));
    assert!(told.lock().unwrap().is_empty(), "a pause is not told");
    let finished =
        Event::Finished { adapter_path: "final/adapter".into(), steps: 9, final_loss: Some(0.5), reason: None };
    events.send(finished).unwrap();
    wait_for("the hold released at the end", || holds.counts() == (2, 2));
    wait_for("the end told", || told.lock().unwrap().len() == 1);
    assert_eq!(told.lock().unwrap()[0].title, "Training finished");
    assert!(told.lock().unwrap()[0].body.contains("2026-12-02-song finished after 9 steps"));

    // A run whose engine goes silent fails: released, and told.
    let events = adopt(&state, &app, &Calls::default());
    wait_for("a hold for the second run", || holds.counts() == (3, 2));
    drop(events);
    wait_for("released on failure", || holds.counts() == (3, 3));
    wait_for("the failure told", || told.lock().unwrap().len() == 2);
    assert_eq!(told.lock().unwrap()[1].title, "Training failed");
}

mod shortcut_labels {
    use ostinato_app::native::shortcuts::*;

    #[test]
    fn a_mac_draws_symbols_in_its_own_order() {
        assert_eq!(label("CmdOrCtrl+Enter", Platform::Mac), "⌘↩");
        assert_eq!(label("CmdOrCtrl+.", Platform::Mac), "⌘.");
        assert_eq!(label("CmdOrCtrl+,", Platform::Mac), "⌘,");
        assert_eq!(label("CmdOrCtrl+Shift+O", Platform::Mac), "⇧⌘O");
        assert_eq!(label("Shift+Alt+CmdOrCtrl+p", Platform::Mac), "⌥⇧⌘P");
        assert_eq!(label("Ctrl+Shift+Tab", Platform::Mac), "⌃⇧⇥");
        assert_eq!(label("CmdOrCtrl++", Platform::Mac), "⌘+");
    }

    #[test]
    fn elsewhere_ctrl_comes_first_in_words() {
        assert_eq!(label("CmdOrCtrl+Enter", Platform::Other), "Ctrl+Enter");
        assert_eq!(label("CmdOrCtrl+.", Platform::Other), "Ctrl+.");
        assert_eq!(label("CmdOrCtrl+,", Platform::Other), "Ctrl+,");
        assert_eq!(label("CmdOrCtrl+Shift+O", Platform::Other), "Ctrl+Shift+O");
        assert_eq!(label("Shift+Alt+CmdOrCtrl+p", Platform::Other), "Ctrl+Alt+Shift+P");
        assert_eq!(label("CmdOrCtrl++", Platform::Other), "Ctrl++");
        assert_eq!(label("Escape", Platform::Other), "Esc");
    }

    #[test]
    fn this_build_knows_its_platform() {
        assert_eq!(Platform::current() == Platform::Mac, cfg!(target_os = "macos"));
    }
}

mod notices {
    use ostinato_app::native::notice::*;
    use ostinato_engine::run_state::RunStatus;

    fn facts(status: RunStatus) -> RunFacts {
        RunFacts { status, steps: 40, name: Some("2026-12-02-song".into()), reason: Some("loss is NaN".into()) }
    }

    #[test]
    fn an_end_while_unfocused_is_told() {
        for (before, now, title) in [
            (RunStatus::Running, RunStatus::Finished, "Training finished"),
            (RunStatus::Running, RunStatus::Failed, "Training failed"),
            (RunStatus::Running, RunStatus::Stopped, "Training stopped"),
            (RunStatus::Paused, RunStatus::Stopped, "Training stopped"),
        ] {
            let n = notice(before, &facts(now), false).unwrap_or_else(|| panic!("{before:?} -> {now:?}"));
            assert_eq!(n.title, title);
            assert!(n.body.starts_with("Run 2026-12-02-song"), "{}", n.body);
        }
        let failed = notice(RunStatus::Running, &facts(RunStatus::Failed), false).unwrap();
        assert_eq!(failed.body, "Run 2026-12-02-song failed at step 40: loss is NaN");
        let finished = notice(RunStatus::Running, &facts(RunStatus::Finished), false).unwrap();
        assert_eq!(finished.body, "Run 2026-12-02-song finished after 40 steps.");
    }

    #[test]
    fn nothing_is_told_to_a_focused_window() {
        for now in [RunStatus::Finished, RunStatus::Failed, RunStatus::Stopped] {
            assert_eq!(notice(RunStatus::Running, &facts(now), true), None, "{now:?}");
        }
    }

    #[test]
    fn a_pause_or_a_run_going_on_is_not_an_end() {
        for (before, now) in [
            (RunStatus::Running, RunStatus::Paused),
            (RunStatus::Paused, RunStatus::Running),
            (RunStatus::Running, RunStatus::Running),
            (RunStatus::Idle, RunStatus::Running),
        ] {
            assert_eq!(notice(before, &facts(now), false), None, "{before:?} -> {now:?}");
        }
    }

    #[test]
    fn an_end_is_told_once() {
        // The views after the end (charts, a reload) repeat the ended status.
        for ended in [RunStatus::Finished, RunStatus::Failed, RunStatus::Stopped] {
            assert_eq!(notice(ended, &facts(ended), false), None, "{ended:?}");
        }
    }
}

mod wake_lock {
    use super::Holds;
    use ostinato_app::native::awake::*;
    use ostinato_engine::run_state::RunStatus;

    #[test]
    fn held_while_running_released_on_pause_and_every_end() {
        for end in [RunStatus::Stopped, RunStatus::Finished, RunStatus::Failed] {
            let holds = Holds::default();
            let mut awake = KeepAwake::new(holds.clone());
            awake.follow(RunStatus::Idle);
            assert!(!awake.is_held());
            awake.follow(RunStatus::Running);
            awake.follow(RunStatus::Running); // every step's view: still the one hold
            assert!(awake.is_held());
            assert_eq!(holds.counts(), (1, 0));
            awake.follow(RunStatus::Paused);
            assert!(!awake.is_held());
            assert_eq!(holds.counts(), (1, 1), "released on pause");
            awake.follow(RunStatus::Running);
            assert_eq!(holds.counts(), (2, 1), "held again on resume");
            awake.follow(end);
            assert!(!awake.is_held());
            assert_eq!(holds.counts(), (2, 2), "released on {end:?}");
        }
    }

    #[test]
    fn a_refusal_is_tried_once_per_running_stretch() {
        let holds = Holds { refuse: true, ..Holds::default() };
        let mut awake = KeepAwake::new(holds.clone());
        for _ in 0..5 {
            awake.follow(RunStatus::Running);
        }
        assert!(!awake.is_held());
        assert_eq!(holds.counts(), (1, 0));
        awake.follow(RunStatus::Paused);
        awake.follow(RunStatus::Running);
        assert_eq!(holds.counts(), (2, 0), "asked again after a pause");
    }

    #[test]
    fn the_system_hold_is_taken_and_released_here() {
        // On Linux the no-op hold; on a Mac or Windows the OS's assertion.
        let mut awake = KeepAwake::new(SystemAwake);
        awake.follow(RunStatus::Running);
        assert!(awake.is_held());
        awake.follow(RunStatus::Finished);
        assert!(!awake.is_held());
    }
}

mod window_geometry {
    use ostinato_app::native::window_memory::*;

    const G: Geometry = Geometry { x: 100, y: 60, width: 1000, height: 700, maximized: false };
    const SCREEN: Screen = Screen { x: 0, y: 0, width: 1920, height: 1080 };

    #[test]
    fn saved_geometry_is_restored_and_garbage_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()), None);
        let g = Geometry { maximized: true, ..G };
        save(dir.path(), &g).unwrap();
        assert_eq!(load(dir.path()), Some(g));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["window.json"], "no temporary file is left");
        std::fs::write(path(dir.path()), b"{\"x\": ").unwrap();
        assert_eq!(load(dir.path()), None);
    }

    #[test]
    fn the_recorder_writes_when_still_and_when_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::new(dir.path().to_path_buf()).unwrap();
        rec.changed(G);
        rec.changed(Geometry { width: 1010, ..G });
        assert_eq!(load(dir.path()), None, "not while the window moves");
        std::thread::sleep(QUIET * 4);
        assert_eq!(load(dir.path()), Some(Geometry { width: 1010, ..G }));
        rec.changed(Geometry { x: 5, ..G });
        rec.flush();
        assert_eq!(load(dir.path()), Some(Geometry { x: 5, ..G }), "flushed at once");
        // Maximized: the size and place to return to are kept.
        rec.changed(Geometry { x: 0, y: 0, width: 1920, height: 1080, maximized: true });
        rec.flush();
        assert_eq!(load(dir.path()), Some(Geometry { x: 5, maximized: true, ..G }));
    }

    #[test]
    fn a_window_restored_maximized_returns_to_its_saved_size() {
        let dir = tempfile::tempdir().unwrap();
        let rec = Recorder::new(dir.path().to_path_buf()).unwrap();
        rec.restored(Geometry { maximized: true, ..G });
        rec.changed(Geometry { x: 0, y: 0, width: 1920, height: 1080, maximized: true });
        rec.flush();
        assert_eq!(load(dir.path()), Some(Geometry { maximized: true, ..G }));
    }

    #[test]
    fn a_window_on_a_screen_keeps_its_place() {
        assert_eq!(placement(G, &[SCREEN], (900, 600)), (G, true));
        // On a second screen to the left of the main one.
        let left = Screen { x: -1280, y: 0, width: 1280, height: 1024 };
        let g = Geometry { x: -1200, ..G };
        assert_eq!(placement(g, &[SCREEN, left], (900, 600)), (g, true));
    }

    #[test]
    fn a_window_whose_screen_is_gone_keeps_its_size_not_its_place() {
        let g = Geometry { x: 2500, ..G };
        assert_eq!(placement(g, &[SCREEN], (900, 600)), (g, false));
        let above = Geometry { y: -400, ..G };
        assert!(!placement(above, &[SCREEN], (900, 600)).1, "its title bar would be off screen");
    }

    #[test]
    fn the_size_stays_between_the_minimum_and_the_largest_screen() {
        let tiny = Geometry { width: 300, height: 200, ..G };
        assert_eq!(placement(tiny, &[SCREEN], (900, 600)).0, Geometry { width: 900, height: 600, ..G });
        let huge = Geometry { width: 5000, height: 3000, x: 0, y: 0, ..G };
        assert_eq!(placement(huge, &[SCREEN], (900, 600)).0, Geometry { width: 1920, height: 1080, ..huge });
        // No screen known: only the minimum applies.
        assert_eq!(placement(huge, &[], (900, 600)).0, huge);
    }
}

mod menu_spec {
    use ostinato_app::native::menu::*;
    use ostinato_app::native::shortcuts::Platform;
    use std::collections::BTreeSet;

    fn item(id: &'static str, text: &'static str, accelerator: &'static str) -> Entry {
        Entry::Item { id, text, accelerator }
    }

    fn items(menu: &[Submenu]) -> Vec<(&'static str, &'static str)> {
        menu.iter()
            .flat_map(|s| &s.entries)
            .filter_map(|e| match e {
                Entry::Item { id, accelerator, .. } => Some((*id, *accelerator)),
                _ => None,
            })
            .collect()
    }

    fn titles(menu: &[Submenu]) -> Vec<&str> {
        menu.iter().map(|s| s.title.as_str()).collect()
    }

    fn entries<'a>(menu: &'a [Submenu], title: &str) -> &'a [Entry] {
        &menu.iter().find(|s| s.title == title).unwrap_or_else(|| panic!("no {title} menu")).entries
    }

    #[test]
    fn app_file_edit_and_run_menus_with_cmd_or_ctrl_accelerators() {
        for platform in [Platform::Mac, Platform::Other] {
            let menu = spec("Ostinato", platform);
            let mut want_titles = vec!["Ostinato", "File", "Edit", "Run"];
            if platform == Platform::Mac {
                want_titles.push("Window");
            }
            assert_eq!(titles(&menu), want_titles, "{platform:?}");
            let want = [
                (SETTINGS, "CmdOrCtrl+,"),
                (OPEN_DATASET, "CmdOrCtrl+O"),
                (OPEN_MODEL, "CmdOrCtrl+Shift+O"),
                (START, "CmdOrCtrl+Enter"),
                (PAUSE, "CmdOrCtrl+P"),
                (RESUME, "CmdOrCtrl+R"),
                (STOP, "CmdOrCtrl+."),
            ];
            let got = items(&menu);
            for w in want {
                assert!(got.contains(&w), "{platform:?}: {w:?} in {got:?}");
            }
            let run: Vec<_> = items(&menu[3..]).into_iter().map(|(id, _)| id).collect();
            assert_eq!(run, [START, PAUSE, RESUME, STOP]);
            let file: Vec<_> = items(&menu[1..2]).into_iter().map(|(id, _)| id).collect();
            assert_eq!(file, [OPEN_DATASET, OPEN_MODEL]);
            // One item per shortcut, and each one a shortcut tauri's menu accepts.
            let accels: BTreeSet<_> = got.iter().map(|(_, a)| *a).collect();
            assert_eq!(accels.len(), got.len(), "a shortcut used twice: {got:?}");
            for (id, a) in &got {
                assert!(a.starts_with("CmdOrCtrl+"), "{id}: {a}");
                a.parse::<muda::accelerator::Accelerator>().unwrap_or_else(|e| panic!("{id}: {a}: {e}"));
            }
            // Every item of the app's own does something.
            for (id, _) in &got {
                assert!(action(id).is_some(), "{id} does nothing");
            }
        }
    }

    #[test]
    fn the_app_menu_has_about_settings_and_quit() {
        let mac = spec("Ostinato", Platform::Mac);
        let app = entries(&mac, "Ostinato");
        assert_eq!(app[0], Entry::Standard(Standard::About));
        assert!(app.contains(&item(SETTINGS, "Settings…", "CmdOrCtrl+,")));
        assert_eq!(app.last(), Some(&Entry::Standard(Standard::Quit)), "the system's Quit (⌘Q)");
        for s in [Standard::Services, Standard::Hide, Standard::HideOthers, Standard::ShowAll] {
            assert!(app.contains(&Entry::Standard(s)), "{s:?}");
        }
        // GTK shows the system's Quit and Hide disabled: elsewhere Quit is the app's own.
        let other = spec("Ostinato", Platform::Other);
        let app = entries(&other, "Ostinato");
        assert_eq!(app[0], Entry::Standard(Standard::About));
        assert!(app.contains(&item(SETTINGS, "Settings…", "CmdOrCtrl+,")));
        assert_eq!(app.last(), Some(&item(QUIT, "Quit", "CmdOrCtrl+Q")));
        assert!(!app.iter().any(|e| matches!(e, Entry::Standard(Standard::Hide | Standard::Quit))));
        assert_eq!(action(QUIT), Some(Action::Quit));
    }

    #[test]
    fn the_edit_menu_has_the_standard_items() {
        use Standard::*;
        let standard = |p| -> Vec<Standard> {
            entries(&spec("Ostinato", p), "Edit")
                .iter()
                .filter_map(|e| match e {
                    Entry::Standard(s) => Some(*s),
                    _ => None,
                })
                .collect()
        };
        // On a Mac a text field copies and pastes only through these items' key equivalents.
        assert_eq!(standard(Platform::Mac), [Undo, Redo, Cut, Copy, Paste, SelectAll]);
        // GTK renders Undo/Redo disabled; the web view's fields do those keys themselves.
        assert_eq!(standard(Platform::Other), [Cut, Copy, Paste, SelectAll]);
        // A Mac's Window menu: minimize (⌘M), zoom, full screen, close (⌘W).
        let window = &spec("Ostinato", Platform::Mac)[4];
        assert_eq!(window.title, "Window");
        let want: Vec<_> = [Minimize, Zoom, Fullscreen, CloseWindow].into_iter().map(Entry::Standard).collect();
        assert_eq!(window.entries, want);
    }

    #[test]
    fn about_names_the_app_and_its_version() {
        let about = about_metadata("Ostinato", env!("CARGO_PKG_VERSION"));
        assert_eq!(about.name.as_deref(), Some("Ostinato"));
        assert_eq!(about.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn shortcut_labels_follow_the_platform() {
        let mac = shortcut_labels(Platform::Mac);
        assert_eq!(mac[START], "⌘↩");
        assert_eq!(mac[STOP], "⌘.");
        assert_eq!(mac[OPEN_MODEL], "⇧⌘O");
        let other = shortcut_labels(Platform::Other);
        assert_eq!(other[START], "Ctrl+Enter");
        assert_eq!(other[STOP], "Ctrl+.");
        assert_eq!(other[SETTINGS], "Ctrl+,");
        assert_eq!(other[QUIT], "Ctrl+Q");
        assert!(!mac.contains_key(QUIT), "a Mac's Quit is the system's");
    }

    #[test]
    fn page_items_ask_the_page_and_run_items_the_bridge() {
        assert_eq!(action(SETTINGS), Some(Action::Page(PageAction::Settings)));
        assert_eq!(action(OPEN_DATASET), Some(Action::Page(PageAction::OpenDataset)));
        assert_eq!(action(OPEN_MODEL), Some(Action::Page(PageAction::OpenModel)));
        assert_eq!(action(START), Some(Action::Page(PageAction::Start)));
        assert_eq!(
            (action(PAUSE), action(RESUME), action(STOP)),
            (Some(Action::Pause), Some(Action::Resume), Some(Action::Stop))
        );
        assert_eq!(action("no.such"), None);
        let json = serde_json::to_value(PageAction::OpenDataset).unwrap();
        assert_eq!(json, serde_json::json!({"action": "open_dataset"}));
        let json = serde_json::to_value(PageAction::Error { message: "no run".into() }).unwrap();
        assert_eq!(json, serde_json::json!({"action": "error", "message": "no run"}));
    }
}

/// The bundle's minimum macOS (`LSMinimumSystemVersion`) is the first on which the
/// engine trains on Metal.
#[test]
fn the_bundle_needs_the_macos_metal_trains_from() {
    use ostinato_engine::device::{metal_trains, parse_version};
    let conf: Value = serde_json::from_str(include_str!("../tauri.conf.json")).expect("tauri.conf.json");
    let minimum = conf["bundle"]["macOS"]["minimumSystemVersion"].as_str().expect("minimumSystemVersion");
    let (major, minor) = parse_version(minimum).expect("a version");
    assert_eq!(metal_trains(Some((major, minor))), Ok(()), "minimumSystemVersion {minimum}");
    assert!(metal_trains(Some((major - 1, 9))).is_err(), "{minimum} is the first that trains");
}
