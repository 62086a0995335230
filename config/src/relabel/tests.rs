use super::*;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn sources(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

fn run(rules: Vec<RuleSpec>, input: &[(&str, &str)]) -> Option<Labels> {
    RelabelRules::new(rules)
        .expect("valid rules")
        .apply(labels(input))
}

#[test]
fn replace_uses_groups_in_target_and_replacement() {
    let out = run(
        vec![RuleSpec {
            source_labels: sources(&["a"]),
            regex: Some("f(o+)".into()),
            target_label: Some("x_${1}".into()),
            replacement: Some("got $1".into()),
            ..RuleSpec::default()
        }],
        &[("a", "foo")],
    );
    assert_eq!(out, Some(labels(&[("a", "foo"), ("x_oo", "got oo")])));
}

#[test]
fn regex_is_anchored_at_both_ends() {
    let spec = |regex: &str| RuleSpec {
        source_labels: sources(&["a"]),
        regex: Some(regex.into()),
        target_label: Some("hit".into()),
        replacement: Some("yes".into()),
        ..RuleSpec::default()
    };
    assert_eq!(
        run(vec![spec("o")], &[("a", "foo")]),
        Some(labels(&[("a", "foo")]))
    );
    assert_eq!(
        run(vec![spec("f.*")], &[("a", "foo")]),
        Some(labels(&[("a", "foo"), ("hit", "yes")]))
    );
}

#[test]
fn empty_replacement_removes_the_target() {
    let out = run(
        vec![RuleSpec {
            source_labels: sources(&["missing"]),
            target_label: Some("a".into()),
            ..RuleSpec::default()
        }],
        &[("a", "foo")],
    );
    assert_eq!(out, Some(labels(&[])));
}

#[test]
fn sources_join_with_the_separator_and_missing_ones_are_empty() {
    let out = run(
        vec![RuleSpec {
            source_labels: sources(&["a", "nope", "b"]),
            separator: Some("|".into()),
            target_label: Some("joined".into()),
            ..RuleSpec::default()
        }],
        &[("a", "1"), ("b", "2")],
    );
    assert_eq!(out.unwrap()["joined"], "1||2");
}

#[test]
fn keep_and_drop_decide_by_the_regex() {
    let keep = RuleSpec {
        action: Some("keep".into()),
        source_labels: sources(&["__meta_process_executable_name"]),
        regex: Some("python3.*".into()),
        ..RuleSpec::default()
    };
    assert!(
        run(
            vec![keep.clone()],
            &[("__meta_process_executable_name", "python3.12")]
        )
        .is_some()
    );
    assert!(run(vec![keep], &[("__meta_process_executable_name", "bash")]).is_none());
    let drop = RuleSpec {
        action: Some("DROP".into()),
        source_labels: sources(&["a"]),
        regex: Some("x|y".into()),
        ..RuleSpec::default()
    };
    assert!(run(vec![drop.clone()], &[("a", "y")]).is_none());
    assert!(run(vec![drop], &[("a", "z")]).is_some());
}

#[test]
fn keepequal_and_dropequal_compare_with_the_target() {
    let spec = |action: &str| RuleSpec {
        action: Some(action.into()),
        source_labels: sources(&["a"]),
        target_label: Some("b".into()),
        ..RuleSpec::default()
    };
    assert!(run(vec![spec("keepequal")], &[("a", "1"), ("b", "1")]).is_some());
    assert!(run(vec![spec("keepequal")], &[("a", "1"), ("b", "2")]).is_none());
    assert!(run(vec![spec("dropequal")], &[("a", "1"), ("b", "1")]).is_none());
}

#[test]
fn hashmod_matches_prometheus() {
    // Prometheus's own test: md5("baz") % 1000 == 976.
    let out = run(
        vec![RuleSpec {
            action: Some("hashmod".into()),
            source_labels: sources(&["c"]),
            target_label: Some("d".into()),
            modulus: Some(1000),
            ..RuleSpec::default()
        }],
        &[("c", "baz")],
    );
    assert_eq!(out.unwrap()["d"], "976");
}

#[test]
fn labelmap_copies_and_meta_labels_go_at_the_end() {
    let out = run(
        vec![RuleSpec {
            action: Some("labelmap".into()),
            regex: Some("__meta_kubernetes_pod_label_(.+)".into()),
            ..RuleSpec::default()
        }],
        &[
            ("__meta_kubernetes_pod_label_app", "web"),
            ("__meta_process_pid", "7"),
            ("kept", "1"),
        ],
    );
    assert_eq!(out, Some(labels(&[("app", "web"), ("kept", "1")])));
}

#[test]
fn labeldrop_and_labelkeep_filter_names() {
    let drop = RuleSpec {
        action: Some("labeldrop".into()),
        regex: Some("tmp_.*".into()),
        ..RuleSpec::default()
    };
    assert_eq!(
        run(vec![drop], &[("tmp_a", "1"), ("b", "2")]),
        Some(labels(&[("b", "2")]))
    );
    let keep = RuleSpec {
        action: Some("labelkeep".into()),
        regex: Some("b".into()),
        ..RuleSpec::default()
    };
    assert_eq!(
        run(vec![keep], &[("tmp_a", "1"), ("b", "2")]),
        Some(labels(&[("b", "2")]))
    );
}

#[test]
fn lowercase_and_uppercase_set_the_target() {
    let spec = |action: &str| RuleSpec {
        action: Some(action.into()),
        source_labels: sources(&["a"]),
        target_label: Some("t".into()),
        ..RuleSpec::default()
    };
    assert_eq!(
        run(vec![spec("lowercase")], &[("a", "MiX")]).unwrap()["t"],
        "mix"
    );
    assert_eq!(
        run(vec![spec("uppercase")], &[("a", "MiX")]).unwrap()["t"],
        "MIX"
    );
}

#[test]
fn bad_rules_are_refused_with_their_position() {
    let good = RuleSpec {
        source_labels: sources(&["a"]),
        target_label: Some("b".into()),
        ..RuleSpec::default()
    };
    let bad_regex = RuleSpec {
        regex: Some("(unclosed".into()),
        ..good.clone()
    };
    let err = RelabelRules::new(vec![good.clone(), bad_regex]).unwrap_err();
    assert_eq!(err.0, 2);
    assert!(
        matches!(err.1, RelabelError::BadRegex { .. }),
        "{:?}",
        err.1
    );
    let unknown = RuleSpec {
        action: Some("rename".into()),
        ..good.clone()
    };
    let err = RelabelRules::new(vec![unknown]).unwrap_err();
    assert_eq!(err.0, 1);
    assert!(
        err.1.to_string().contains("unknown action \"rename\""),
        "{}",
        err.1
    );
    assert!(err.1.to_string().contains("labelmap"), "{}", err.1);
    for (spec, expected) in [
        (
            RuleSpec {
                target_label: None,
                ..good.clone()
            },
            RelabelError::MissingTarget("replace"),
        ),
        (
            RuleSpec {
                action: Some("hashmod".into()),
                ..good.clone()
            },
            RelabelError::MissingModulus,
        ),
        (
            RuleSpec {
                target_label: Some("1bad".into()),
                ..good.clone()
            },
            RelabelError::BadTarget("1bad".into()),
        ),
        (
            RuleSpec {
                source_labels: sources(&["a-b"]),
                ..good.clone()
            },
            RelabelError::BadSource("a-b".into()),
        ),
        (
            RuleSpec {
                action: Some("labeldrop".into()),
                source_labels: vec![],
                ..good.clone()
            },
            RelabelError::UnusedField {
                action: "labeldrop",
                field: "target_label",
            },
        ),
    ] {
        assert_eq!(RelabelRule::new(spec).unwrap_err(), expected);
    }
}

#[test]
fn a_huge_regex_is_refused_not_compiled_without_bound() {
    let spec = RuleSpec {
        source_labels: sources(&["a"]),
        target_label: Some("b".into()),
        regex: Some("(a{1000}){1000}".into()),
        ..RuleSpec::default()
    };
    assert!(matches!(
        RelabelRule::new(spec),
        Err(RelabelError::BadRegex { .. })
    ));
}

#[test]
fn rules_reading_thread_or_cpu_labels_are_told_apart() {
    let rules = |spec: RuleSpec| RelabelRules::new(vec![spec]).expect("valid");
    let by_source = |name: &str| {
        rules(RuleSpec {
            source_labels: sources(&[name]),
            target_label: Some("x".into()),
            ..RuleSpec::default()
        })
    };
    assert!(by_source("__meta_thread_comm").reads_thread_labels());
    assert!(by_source("__meta_cpuid").reads_thread_labels());
    assert!(!by_source("__meta_process_pid").reads_thread_labels());
    let labelmap = |regex: &str| {
        rules(RuleSpec {
            action: Some("labelmap".into()),
            regex: Some(regex.into()),
            ..RuleSpec::default()
        })
    };
    assert!(labelmap("__meta_(thread_comm)").reads_thread_labels());
    assert!(labelmap("__meta_(.*)").reads_thread_labels());
    assert!(!labelmap("__meta_process_(.*)").reads_thread_labels());
    assert!(!RelabelRules::default().reads_thread_labels());
}
