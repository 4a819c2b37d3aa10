//! Every sentence the gateway says to a buyer, in each language it speaks: one catalogue for
//! the JSON `message` and for the pages (their headings and labels too). A leaf: it knows no
//! decision, page or request; callers name a [`Message`] or a [`Label`] and a [`Lang`].
//!
//! English is the contract's wording (tests assert it); every entry has a Chinese one, the two
//! `match`es below being exhaustive.

use std::borrow::Cow;

crate::label_enum! {
    /// A language the gateway answers in (the `lang` attribute of a page).
    pub enum Lang {
        En => "en",
        Zh => "zh",
    }
}

/// The answer to a buyer of a variant that is sold out: names it, and says others may remain.
pub fn variant_sold_out(lang: Lang, variant: &str) -> String {
    match lang {
        Lang::En => format!("Variant {variant} is sold out; other variants may still be on sale"),
        Lang::Zh => format!("款式 {variant} 已售罄；其他款式可能仍有库存"),
    }
}

/// English unless the client asks for another spoken here.
impl Default for Lang {
    fn default() -> Self {
        Lang::En
    }
}

impl Lang {
    /// The language a primary subtag names (`en`, `zh`, any case), if it is one spoken here.
    pub fn from_subtag(subtag: &str) -> Option<Lang> {
        Lang::ALL
            .iter()
            .copied()
            .find(|l| l.as_str().eq_ignore_ascii_case(subtag))
    }
}

/// Why a request was malformed. The text is safe to show to buyers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadRequest {
    QuantityNotInteger,
    QuantityTooSmall,
    QuantityTooLarge,
    QuantityRepeated,
    /// A parameter another spelling of the quantity's name (`QTY`, `%71ty`, `qty[]`), or a
    /// body's quantity that differs from the query's.
    QuantityAmbiguous,
    IdempotencyKeyInvalid,
    BodyTooLarge,
    /// The body did not arrive within `server.sale_body_timeout_ms`.
    BodyTooSlow,
    HeadersTooLarge,
    MalformedBody,
    /// The request-target cannot be forwarded in its canonical form (a malformed query).
    MalformedTarget,
    /// The request-target cannot be read (not UTF-8 once decoded, a control character, too
    /// deep): refused on every route.
    UnreadableTarget,
    /// The request-target resembles a sale route without being one: refused on every route.
    LookAlikeTarget,
    /// A retry with an `Idempotency-Key` whose purchase was for another quantity.
    QuantityDiffersFromRetry,
    /// A purchase on an activity with variants that names none.
    VariantMissing,
    /// The variant named twice (the parameter repeated, or the path's and the query's), or
    /// under another spelling of its parameter's name, or percent-encoded.
    VariantAmbiguous,
    /// A variant named on an activity that has none.
    VariantNotSold,
    /// A retry with an `Idempotency-Key` whose purchase was for another variant.
    VariantDiffersFromRetry,
    /// The request names more than one buyer (two bearer tokens, a bearer token and another
    /// buyer's session cookie, the session cookie twice).
    IdentityAmbiguous,
    /// A second-chance line joined while units are on sale and nobody waits: buy instead.
    LineWhileOnSale,
}

impl BadRequest {
    /// Every reason, once (the catalogue's test reads each).
    pub const ALL: [BadRequest; 20] = [
        BadRequest::QuantityNotInteger,
        BadRequest::QuantityTooSmall,
        BadRequest::QuantityTooLarge,
        BadRequest::QuantityRepeated,
        BadRequest::QuantityAmbiguous,
        BadRequest::IdempotencyKeyInvalid,
        BadRequest::BodyTooLarge,
        BadRequest::BodyTooSlow,
        BadRequest::HeadersTooLarge,
        BadRequest::MalformedBody,
        BadRequest::MalformedTarget,
        BadRequest::UnreadableTarget,
        BadRequest::LookAlikeTarget,
        BadRequest::QuantityDiffersFromRetry,
        BadRequest::VariantMissing,
        BadRequest::VariantAmbiguous,
        BadRequest::VariantNotSold,
        BadRequest::VariantDiffersFromRetry,
        BadRequest::IdentityAmbiguous,
        BadRequest::LineWhileOnSale,
    ];

    fn en(self) -> &'static str {
        use BadRequest::*;
        match self {
        QuantityNotInteger => "Quantity must be a whole number",
        QuantityTooSmall => "Quantity must be at least 1",
        QuantityTooLarge => "Quantity exceeds the most one request may buy",
        QuantityRepeated => "Quantity must be given once",
        QuantityAmbiguous => "Quantity must be given once, as the route's quantity parameter",
        IdempotencyKeyInvalid => {
            "Idempotency-Key must be given once, 1 to 128 visible ASCII characters"
        }
        BodyTooLarge => "Request body too large",
        BodyTooSlow => "Request body not received in time",
        HeadersTooLarge => "Request headers too large",
        MalformedBody => "Malformed request body",
        MalformedTarget => "Malformed request target",
        UnreadableTarget => {
            "Request target cannot be read (not UTF-8, a control character, or too deep)"
        }
        LookAlikeTarget => {
            "Request target resembles a sale route without being one: use the route as published"
        }
        QuantityDiffersFromRetry => {
            "This Idempotency-Key already bought another quantity: retry with the same one, or use a new key"
        }
        VariantMissing => "This sale sells several variants: name the one you buy",
        VariantAmbiguous => "The variant must be named once, as the route names it",
        VariantNotSold => "This sale has no variants: name none",
        VariantDiffersFromRetry => {
            "This Idempotency-Key already bought another variant: retry with the same \
             variant, or use a new key"
        }
        IdentityAmbiguous => {
            "The request names more than one buyer: send one identity (one Authorization \
             header, or one session cookie of the same buyer)"
        }
        LineWhileOnSale => "This sale is not sold out: buy it directly, no line to join",
        }
    }

    fn zh(self) -> &'static str {
        use BadRequest::*;
        match self {
            QuantityNotInteger => "数量必须是整数",
            QuantityTooSmall => "数量至少为 1",
            QuantityTooLarge => "数量超过单次购买上限",
            QuantityRepeated => "数量只能给出一次",
            QuantityAmbiguous => "数量只能以该路由的数量参数给出一次",
            IdempotencyKeyInvalid => {
                "Idempotency-Key 只能给出一次，且为 1 到 128 个可见 ASCII 字符"
            }
            BodyTooLarge => "请求内容过大",
            BodyTooSlow => "未能及时收到请求内容",
            HeadersTooLarge => "请求头过大",
            MalformedBody => "请求内容格式错误",
            MalformedTarget => "请求地址格式错误",
            UnreadableTarget => "无法读取请求地址（非 UTF-8、含控制字符或层级过深）",
            LookAlikeTarget => "请求地址与抢购路由相似但并非抢购路由：请使用公布的地址",
            QuantityDiffersFromRetry => {
                "此 Idempotency-Key 已购买了其他数量：请用相同数量重试，或使用新的 key"
            }
            VariantMissing => "此抢购有多个款式：请指定要购买的款式",
            VariantAmbiguous => "款式只能按路由的方式指定一次",
            VariantNotSold => "此抢购没有款式之分：请勿指定款式",
            VariantDiffersFromRetry => {
                "此 Idempotency-Key 已购买了其他款式：请用相同款式重试，或使用新的 key"
            }
            IdentityAmbiguous => {
                "请求中包含多个买家身份：只能携带一个身份（一个 Authorization 头，或同一买家的一个会话 Cookie）"
            }
            LineWhileOnSale => "本商品尚未售罄：请直接购买，无需排队等待",
        }
    }
}

/// A message a buyer reads: the JSON `message` of an answer, and the main text of its page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// A malformed request (400 `bad_request`): why.
    BadRequest(BadRequest),
    /// Another method on a sale route's path (405).
    MethodNotAllowed,
    Reserved,
    SignIn,
    NoSuchSale,
    NotStarted,
    NotEligible,
    Ended,
    SlowDown,
    SoldOut,
    OverLimit,
    Busy,
    BusyQueue,
    Halted,
    InQueue,
    InvalidTicket,
    TicketLapsed,
    TicketAbsent,
    Forwarded,
    NoSuchVariant,
    /// The waiting room: the buyer's place.
    QueuePlace {
        position: u64,
    },
    /// The waiting room, before the draw: `count` buyers so far.
    QueueBeforeDraw {
        count: u64,
    },
    QueuePaused {
        position: u64,
    },
    QueueTooLate {
        position: u64,
    },
    /// The waiting room asks for a proof of work before a ticket.
    SolveChallenge,
    YourTurn,
    QueueSoldOut,
    Bought,
    /// A poll of a sale without a waiting room.
    NoQueue,
    /// The second-chance line: the buyer's place.
    LinePlace {
        position: u64,
    },
    /// The second-chance line: a returned unit is held for the buyer.
    LineYourTurn,
}

impl Message {
    /// The text in `lang`.
    pub fn text(self, lang: Lang) -> Cow<'static, str> {
        match lang {
            Lang::En => self.en(),
            Lang::Zh => self.zh(),
        }
    }

    fn en(self) -> Cow<'static, str> {
        use Message::*;
        Cow::Borrowed(match self {
            BadRequest(why) => why.en(),
            MethodNotAllowed => "This address takes only the methods its Allow header names",
            Reserved => "Reserved",
            SignIn => "Sign in to take part in the sale",
            NoSuchSale => "No such sale",
            NotStarted => "The sale has not started yet",
            NotEligible => "The sale is open to an earlier group of buyers for now; your turn to buy opens later",
            Ended => "The sale has ended",
            SlowDown => "Too many attempts, slow down",
            SoldOut => "Sold out",
            OverLimit => "This would take you over the per-buyer limit",
            Busy => "The sale is busy, please retry shortly",
            BusyQueue => "The shop is busy: too many buyers ahead of you, please retry",
            Halted => "The sale is paused by the shop, please retry shortly",
            InQueue => "You are in the queue for this sale",
            InvalidTicket => "This queue ticket is not valid for you or for this sale",
            TicketLapsed => "Your turn passed: the queue ticket has lapsed",
            TicketAbsent => "Your turn came while you were away (your page stopped checking in), so it went to the next buyer: this ticket has lapsed",
            Forwarded => "Forwarded unreserved",
            QueuePlace { position } => {
                return Cow::Owned(format!("You are number {position} in the queue"))
            }
            QueueBeforeDraw { count } => {
                let buyers = if count == 1 { "buyer" } else { "buyers" };
                return Cow::Owned(format!(
                    "You are in the queue with {count} {buyers} so far: places are drawn at \
                     random when the sale starts, arriving earlier gives no advantage"
                ));
            }
            QueuePaused { position } => {
                return Cow::Owned(format!(
                    "You are number {position} in the queue; the queue is paused for now: \
                     no one moves ahead until it runs again, keep this page open"
                ))
            }
            QueueTooLate { position } => {
                return Cow::Owned(format!(
                    "You are number {position} in the queue; judging by what buyers ahead of \
                     you have bought so far, the stock will probably run out before your turn \
                     (an estimate)"
                ))
            }
            YourTurn => "It is your turn: buy now",
            SolveChallenge => {
                "Solve the challenge (a short computation your browser does by itself) to get \
                 your place in the queue"
            }
            QueueSoldOut => "The item is sold out",
            NoSuchVariant => "This sale has no such variant",
            Bought => "You bought it: your order is placed",
            NoQueue => "This sale has no waiting room: buy at its sale route directly",
            LineYourTurn => "A unit that came back is held for you: buy now",
            LinePlace { position } => {
                return Cow::Owned(format!(
                    "You are number {position} in the line for units that come back"
                ))
            }
        })
    }

    fn zh(self) -> Cow<'static, str> {
        use Message::*;
        Cow::Borrowed(match self {
            BadRequest(why) => why.zh(),
            MethodNotAllowed => "此地址只接受 Allow 响应头列出的请求方法",
            Reserved => "已为您预留",
            SignIn => "请先登录再参加抢购",
            NoSuchSale => "没有这个抢购活动",
            NotStarted => "抢购尚未开始",
            NotEligible => "目前仅限优先购买的买家；您的购买时间稍后开始",
            Ended => "抢购已结束",
            SlowDown => "尝试次数过多，请稍后再试",
            SoldOut => "已售罄",
            OverLimit => "超出每人限购数量",
            Busy => "抢购繁忙，请稍后重试",
            BusyQueue => "商店繁忙：您前面的买家太多，请稍后重试",
            Halted => "商店已暂停本次销售，请稍后重试",
            InQueue => "您已进入本次抢购的队列",
            InvalidTicket => "此排队凭证对您或本次抢购无效",
            TicketLapsed => "您的机会已过：排队凭证已失效",
            TicketAbsent => {
                "轮到您时您已离开（页面停止了刷新），机会已让给下一位：此排队凭证已失效"
            }
            Forwarded => "未预留，已直接转发",
            QueuePlace { position } => return Cow::Owned(format!("您排在第 {position} 位")),
            QueueBeforeDraw { count } => {
                return Cow::Owned(format!(
                    "目前共有 {count} 位买家在排队：开售时随机抽取顺序，早到没有优势"
                ))
            }
            QueuePaused { position } => {
                return Cow::Owned(format!(
                    "您排在第 {position} 位；队列暂时暂停：恢复前没有人前进，请保持此页面打开"
                ))
            }
            QueueTooLate { position } => {
                return Cow::Owned(format!(
                    "您排在第 {position} 位；按前面买家目前的购买情况估计，轮到您之前库存可能已售完（仅为估计）"
                ))
            }
            YourTurn => "轮到您了：现在就买",
            SolveChallenge => "请先完成验证（浏览器会自动进行一小段计算），即可获得排队位置",
            QueueSoldOut => "商品已售罄",
            NoSuchVariant => "本次抢购没有这个款式",
            Bought => "购买成功：您的订单已提交",
            NoQueue => "此活动没有排队：请直接在购买页面下单",
            LineYourTurn => "有一件退回的商品为您保留：请立即购买",
            LinePlace { position } => {
                return Cow::Owned(format!("您在退回商品候补队列中排第 {position} 位"))
            }
        })
    }
}

crate::label_enum! {
    /// A heading or label of the pages (the templates' `text.<name>`, and the waiting page's
    /// script's).
    pub enum Label {
        TitleWaiting => "title_waiting",
        TitlePaused => "title_paused",
        TitleYourTurn => "title_your_turn",
        TitleSoldOut => "title_sold_out",
        TitleExpired => "title_expired",
        TitleBought => "title_bought",
        TitleRefused => "title_refused",
        TitleNotOpen => "title_not_open",
        TitleNotYourPhase => "title_not_your_phase",
        TitleLine => "title_line",
        JoinLine => "join_line",
        LineOffer => "line_offer",
        Place => "place",
        Waiting => "waiting",
        EstimatedWait => "estimated_wait",
        AboutSeconds => "about_seconds",
        AboutMinutes => "about_minutes",
        Paused => "paused",
        TooLate => "too_late",
        KeepOpen => "keep_open",
        Refreshes => "refreshes",
        Progress => "progress",
        BuyNow => "buy_now",
        TakingYou => "taking_you",
        BackToShop => "back_to_shop",
        ConnectionLost => "connection_lost",
        NoAnswer => "no_answer",
        RetryAfter => "retry_after",
        Order => "order",
        Item => "item",
        Choose => "choose",
        TicketReplaced => "ticket_replaced",
        OpensAt => "opens_at",
        OpensIn => "opens_in",
        TryAgain => "try_again",
        TurnLeft => "turn_left",
    }
}

impl Label {
    /// The text in `lang`; `{n}` stands for a number the page fills in.
    pub fn text(self, lang: Lang) -> &'static str {
        match lang {
            Lang::En => self.en(),
            Lang::Zh => self.zh(),
        }
    }

    fn en(self) -> &'static str {
        use Label::*;
        match self {
            TitleWaiting => "In the queue",
            TitlePaused => "Queue paused",
            TitleYourTurn => "It is your turn",
            TitleSoldOut => "Sold out",
            TitleExpired => "Your turn has passed",
            TitleBought => "You bought it",
            TitleRefused => "Not possible right now",
            TitleNotOpen => "Not open yet",
            TitleNotYourPhase => "Not your turn yet",
            TitleLine => "In the line for returns",
            JoinLine => "Join the line for returns",
            LineOffer => "Units may come back (unpaid orders, cancellations): each goes to the next buyer in the line.",
            Place => "Your place in the queue",
            Waiting => "{n} waiting",
            EstimatedWait => "Estimated wait:",
            AboutSeconds => "about {n} s",
            AboutMinutes => "about {n} min",
            Paused => "Paused: no estimate until the queue runs again",
            TooLate => {
                "Probably too late (an estimate from what buyers ahead have bought so far): the \
                 stock may run out before your turn."
            }
            KeepOpen => "Keep this page open: it refreshes by itself.",
            Refreshes => "This page refreshes itself every few seconds.",
            Progress => "Progress through the queue",
            BuyNow => "Buy now",
            TakingYou => "Taking you to the purchase\u{2026}",
            BackToShop => "Back to the shop",
            ConnectionLost => "Connection lost; trying again\u{2026}",
            NoAnswer => "The queue did not answer; trying again.",
            RetryAfter => "You may try again in {n} s.",
            Order => "Order reference:",
            Item => "Item:",
            Choose => "Choose one to buy:",
            OpensAt => "Opens at",
            OpensIn => "Opens in {n}",
            TryAgain => "Try again",
            TurnLeft => "Buy within {n}, or your turn passes to the next buyer.",
            TicketReplaced => {
                "This browser held a queue ticket that is not yours (another account's, or \
                 damaged): it was replaced by your own place."
            }
        }
    }

    fn zh(self) -> &'static str {
        use Label::*;
        match self {
            TitleWaiting => "排队中",
            TitlePaused => "队列已暂停",
            TitleYourTurn => "轮到您了",
            TitleSoldOut => "已售罄",
            TitleExpired => "您的机会已过",
            TitleBought => "购买成功",
            TitleRefused => "暂时无法完成",
            TitleNotOpen => "尚未开放",
            TitleNotYourPhase => "尚未轮到您",
            TitleLine => "退回商品候补中",
            JoinLine => "加入退回商品候补",
            LineOffer => "可能会有商品退回（未付款订单、取消的订单）：每一件都会按顺序留给候补中的下一位买家。",
            Place => "您在队列中的位置",
            Waiting => "{n} 人在排队",
            EstimatedWait => "预计等待：",
            AboutSeconds => "约 {n} 秒",
            AboutMinutes => "约 {n} 分钟",
            Paused => "已暂停：队列恢复前无法估计等待时间",
            TooLate => "可能来不及了（根据前面买家目前的购买情况估计）：轮到您之前库存可能会售完。",
            KeepOpen => "请保持此页面打开，它会自动刷新。",
            Refreshes => "此页面每隔几秒自动刷新。",
            Progress => "排队进度",
            BuyNow => "立即购买",
            TakingYou => "正在前往购买\u{2026}",
            BackToShop => "返回商店",
            ConnectionLost => "连接中断，正在重试\u{2026}",
            NoAnswer => "队列没有应答，正在重试。",
            RetryAfter => "{n} 秒后可以重试。",
            Order => "订单号：",
            Item => "商品：",
            Choose => "请选择要购买的款式：",
            OpensAt => "开放时间",
            OpensIn => "距开放还有 {n}",
            TryAgain => "再试一次",
            TurnLeft => "请在 {n} 内购买，之后机会将让给下一位买家。",
            TicketReplaced => {
                "此浏览器保存的排队凭证不属于您（属于其他账号或已损坏），已替换为您自己的位置。"
            }
        }
    }

    /// Every label in `lang`, by name (what a page is given as `text`).
    pub fn all(lang: Lang) -> std::collections::BTreeMap<&'static str, &'static str> {
        Label::ALL
            .iter()
            .map(|l| (l.as_str(), l.text(lang)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn han(text: &str) -> bool {
        text.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))
    }

    /// Every message the gateway can say, one of each kind.
    pub(crate) fn every_message() -> Vec<Message> {
        use Message::*;
        let mut all: Vec<Message> = crate::catalogue::BadRequest::ALL
            .into_iter()
            .map(Message::BadRequest)
            .collect();
        all.extend([
            MethodNotAllowed,
            Reserved,
            SignIn,
            NoSuchSale,
            NotStarted,
            NotEligible,
            Ended,
            SlowDown,
            SoldOut,
            OverLimit,
            Busy,
            BusyQueue,
            Halted,
            InQueue,
            InvalidTicket,
            TicketLapsed,
            TicketAbsent,
            Forwarded,
            NoSuchVariant,
            QueuePlace { position: 7 },
            QueueBeforeDraw { count: 7 },
            QueuePaused { position: 7 },
            QueueTooLate { position: 7 },
            SolveChallenge,
            YourTurn,
            QueueSoldOut,
            Bought,
            NoQueue,
            LinePlace { position: 7 },
            LineYourTurn,
        ]);
        all
    }

    #[test]
    fn every_message_and_label_is_in_english_and_chinese() {
        for m in every_message() {
            let (en, zh) = (m.text(Lang::En), m.text(Lang::Zh));
            assert!(!en.is_empty() && !han(&en), "{m:?}: {en}");
            assert!(han(&zh), "{m:?} has no Chinese text: {zh}");
            // A number in the English text is in the Chinese one too.
            if en.contains('7') {
                assert!(zh.contains('7'), "{m:?}: {zh}");
            }
        }
        for l in Label::ALL {
            let (en, zh) = (l.text(Lang::En), l.text(Lang::Zh));
            assert!(!en.is_empty() && !han(en), "{l:?}");
            assert!(han(zh), "{l:?} has no Chinese text");
            assert_eq!(en.contains("{n}"), zh.contains("{n}"), "{l:?}");
        }
    }

    #[test]
    fn one_buyer_is_a_buyer() {
        let one = Message::QueueBeforeDraw { count: 1 }.text(Lang::En);
        assert!(one.contains("with 1 buyer so far"), "{one}");
        let two = Message::QueueBeforeDraw { count: 2 }.text(Lang::En);
        assert!(two.contains("with 2 buyers so far"), "{two}");
    }

    #[test]
    fn languages_by_subtag() {
        assert_eq!(Lang::from_subtag("ZH"), Some(Lang::Zh));
        assert_eq!(Lang::from_subtag("en"), Some(Lang::En));
        assert_eq!(Lang::from_subtag("fr"), None);
    }
}
