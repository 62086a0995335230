use super::*;

#[test]
fn learns_this_process_and_sweeps_a_dead_one() {
    let mut table = ProcessTable::new(NonZeroUsize::new(4).unwrap());
    let me = std::process::id();
    let (p, learned) = table.get_or_learn(me, "test");
    assert!(learned);
    assert_eq!(p.info.pid, me);
    assert!(!p.mappings.is_empty());
    let here = learns_this_process_and_sweeps_a_dead_one as *const () as u64;
    assert!(p.mapping(here).is_some(), "own code is mapped");

    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    table.get_or_learn(pid, "true");
    child.wait().unwrap();
    assert_eq!(table.len(), 2);
    assert_eq!(table.sweep_exited(), vec![pid]);
    assert!(table.get(pid).is_none());
    assert!(table.get(me).is_some());
}

#[test]
fn samples_keep_the_image_they_were_taken_in_across_an_exec() {
    let mut table = ProcessTable::new(NonZeroUsize::new(4).unwrap());
    let me = std::process::id();
    let first = table.get_or_learn(me, "test").0.image;
    let t = crate::clock::MonotonicToUnix::monotonic_now();
    assert_eq!(table.image_at(me, t), Some(first));
    let snapshot = || ImageSnapshot::read(me, "test");
    assert!(table.exec(me, t + 100, snapshot()));
    let second = table.get(me).unwrap().image;
    assert_ne!(first, second);
    assert_eq!(table.image_at(me, t + 99), Some(first), "before the exec");
    assert_eq!(table.image_at(me, t + 100), Some(second));
    assert_eq!(table.image(me, first).unwrap().image, first);
    assert!(table.known_before(me, t + 100));
    assert!(
        !table.known_before(me, t + 99),
        "an exit before the exec was another image's"
    );
    assert!(table.exec(me, t + 200, snapshot()));
    let third = table.get(me).unwrap().image;
    assert_eq!(table.image_at(me, t + 150), Some(second));
    table.end_batch();
    assert!(
        table.image(me, first).is_none(),
        "replaced images go with the batch"
    );
    assert_eq!(table.image(me, third).unwrap().image, third);
    assert_eq!(
        table.image_at(me, t + 150),
        None,
        "an image no longer known"
    );
}

#[test]
fn an_image_learned_after_its_exec_is_that_execs_image() {
    let mut table = ProcessTable::new(NonZeroUsize::new(4).unwrap());
    let me = std::process::id();
    let exec_at = crate::clock::MonotonicToUnix::monotonic_now();
    // A sample was read before the exec's event.
    let learned = table.get_or_learn(me, "test").0.image;
    assert!(!table.exec(me, exec_at, ImageSnapshot::read(me, "test")));
    assert_eq!(table.get(me).unwrap().image, learned, "the same image");
    assert_eq!(table.image_at(me, exec_at + 1), Some(learned));
    assert_eq!(
        table.image_at(me, exec_at - 1),
        None,
        "before the exec: unknown"
    );
}

#[test]
fn an_exiting_process_keeps_its_mappings_for_its_last_samples() {
    let mut table = ProcessTable::new(NonZeroUsize::new(4).unwrap());
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = child.id();
    // Until the exec shows in the maps.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ProcessMappings::read(pid)
        .is_ok_and(|m| m.mappings().iter().any(|f| f.path.contains("sleep")))
    {
        assert!(Instant::now() < deadline, "sleep never showed in its maps");
        std::thread::sleep(Duration::from_millis(10));
    }
    let known = table.get_or_learn(pid, "sleep").0.mappings.len();
    assert!(known > 0);
    // Killed and not reaped: a zombie, whose maps read empty.
    child.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ProcessMappings::read(pid).is_ok_and(|m| m.is_empty()) {
        assert!(Instant::now() < deadline, "the zombie's maps still read");
        std::thread::sleep(Duration::from_millis(10));
    }
    // An address no mapping covers asks for a re-read, which reads nothing.
    assert!(!table.refresh_if_unmapped(pid, [0x10]));
    assert_eq!(table.get(pid).unwrap().mappings.len(), known);
    child.wait().unwrap();
}

/// A read an `exec` tears (maps of one image, executable of the next) is
/// started again: every snapshot of a process that execs `nice` and `env`
/// in turn maps the executable it names. Such a torn snapshot, read just
/// before the exec's event arrived, became a second image named like the
/// new one: two resources of one pid and executable in a request.
#[test]
fn a_snapshot_names_the_executable_it_maps_while_the_process_execs() {
    const EXECS: usize = 1000;
    let chain = (0..EXECS).map(|i| if i % 2 == 0 { "env" } else { "nice" });
    let mut child = std::process::Command::new("nice")
        .args(chain)
        .args(["sleep", "0.2"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let (mut whole, mut torn) = (0, Vec::new());
    let mut names = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let snapshot = ImageSnapshot::read(pid, "");
        let path = snapshot.info.executable_path.clone();
        if path.ends_with("/sleep") || child.try_wait().unwrap().is_some() {
            break;
        }
        if snapshot.mappings.is_empty() {
            // Read amid an exec's switch of address spaces.
            continue;
        }
        if snapshot.mappings.mappings().iter().any(|m| m.path == path) {
            whole += 1;
            names.insert(path);
        } else {
            torn.push(path);
        }
    }
    let _ = child.kill();
    child.wait().unwrap();
    println!("{whole} whole snapshots of {names:?}, {} torn", torn.len());
    assert!(torn.is_empty(), "torn snapshots named {torn:?}");
    assert!(whole >= 50 && names.len() == 2, "too few reads mid-chain");
}
