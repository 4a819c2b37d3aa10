//! The templates render for every state and language, and replacements are used; what a
//! browser makes of the pages is tested in Chromium (tests/e2e/pages.rs).

use super::*;
use crate::config::ActivityPage;
use crate::decision::Decision;

fn answer(status: Status) -> Answer {
    Answer {
        variants: Vec::new(),
        ticket: "t1.a.1.2.x".into(),
        status,
        turn_left_ms: None,
        challenge: None,
        draw: None,
        cookie_max_age_secs: 60,
        ticket_replaced: false,
    }
}

fn waiting(position: u64, paused: bool, too_late: bool) -> Status {
    Status::Waiting {
        position,
        estimated_wait_ms: 4_000,
        refresh_after_ms: 1_000,
        likely_too_late: too_late,
        drawn: true,
        paused,
    }
}

fn page(pages: &Pages, lang: Lang, status: Status, landing: &Landing) -> String {
    let keys = ActivityPage {
        title: Some("Phone X <launch>".into()),
        success_url: None,
    };
    pages.waiting(
        lang,
        &Waiting {
            answer: &answer(status),
            sale: Sale {
                id: "1001",
                page: &keys,
            },
            landing,
            reservation: None,
        },
    )
}

#[test]
fn the_built_in_templates_render_every_state_in_every_language() {
    let pages = Pages::new(&PagesSettings {
        shop_name: "Example Shop".into(),
        shop_url: "/".into(),
        ..PagesSettings::default()
    });
    let buy = Landing::Purchase {
        method: "POST".into(),
        target: "/api/seckill/1001/buy".into(),
    };
    for lang in Lang::ALL.iter().copied() {
        for status in [
            waiting(3, false, false),
            waiting(3, true, false),
            waiting(3, false, true),
            Status::YourTurn,
            Status::SoldOut,
            Status::Expired,
            Status::Bought,
        ] {
            let html = page(&pages, lang, status, &buy);
            assert!(
                html.contains(&format!("<html lang=\"{}\"", lang.as_str())),
                "{html}"
            );
            assert!(html.contains("Example Shop"));
            assert!(html.contains("Phone X &lt;launch&gt;"), "escaped title");
            let code = queue_page::code(&status).0;
            assert!(html.contains(&format!("data-flashgate-code=\"{code}\"")));
            // Never a refresh to the sale URL: only to the queue's.
            assert!(!html.contains("url=/api/seckill"), "{html}");
        }
        for decision in [
            Decision::SoldOut,
            Decision::RateLimited {
                retry_after: std::time::Duration::from_secs(3),
            },
        ] {
            let html = pages.refusal(lang, &decision.reply(), None, None, None);
            assert!(html.contains("Example Shop"), "{html}");
        }
    }
}

#[test]
fn the_page_cannot_be_broken_out_of() {
    let pages = Pages::new(&PagesSettings::default());
    let landing = Landing::Purchase {
        method: "POST".into(),
        target: "/seckill/a?x=</script><script>alert(1)</script>".into(),
    };
    let html = page(&pages, Lang::En, waiting(3, false, false), &landing);
    assert_eq!(
        html.matches("</script>").count(),
        html.matches("<script").count()
    );
    assert!(!html.contains("alert(1)</script>"));
}

#[test]
fn a_replacement_template_is_used_and_one_failing_at_render_falls_back() {
    let mut templates = std::collections::HashMap::new();
    templates.insert(
        "refusal.html",
        "<p>{{ shop_name }}: {{ code }}</p>".to_owned(),
    );
    templates.insert("waiting.html", "{{ nothing.here.at_all() }}".to_owned());
    let pages = Pages::new(&PagesSettings {
        shop_name: "Mine".into(),
        templates,
        ..PagesSettings::default()
    });
    let html = pages.refusal(Lang::En, &Decision::SoldOut.reply(), None, None, None);
    assert_eq!(html, "<p>Mine: sold_out</p>");
    let landing = Landing::Url("/buy".into());
    let html = page(&pages, Lang::En, Status::YourTurn, &landing);
    assert!(html.contains("data-flashgate-code=\"your_turn\""), "{html}");
}
