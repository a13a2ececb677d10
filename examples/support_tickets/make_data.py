"""Writes the support-ticket example's data: short customer messages -> a JSON ticket.

    python examples/support_tickets/make_data.py      # rewrites the .jsonl files next to it

Deterministic (one seeded generator): the committed files are exactly what this prints. Each
message is assembled from a situation (its category, whether it asks for a refund, whether it
names an order), a product, an urgency cue, an opener and a sign-off, in a few writing styles;
its ticket is what was chosen:

    {"category": "billing" | "shipping" | "technical" | "account" | "returns",
     "urgency": "low" | "medium" | "high",      high: a stated deadline or alarm; low: "no rush"
     "order_id": "AB-12345" | null,            the order number when the message gives one
     "wants_refund": true | false}             the customer asks for money back

Every labelled row also carries `triage`, the ticket's category and order number: the gold
output of the quick-start task (`triage.yaml`, what `make run` trains).

Files: train.jsonl (240 messages, the first 60 with a gold `ticket`, the rest unlabelled, as
a practitioner's data would be), dev.jsonl (30 messages: calibration inputs; each with its gold
`triage`, for the quick start's dev curve and the choice of its settings, but no `ticket`),
test.jsonl (60 labelled), demonstrations.jsonl (3 labelled, of three categories:
`demonstrations`).

test_fresh.jsonl (200 labelled, each with `ticket` and `triage`): a second test split drawn
afterwards with its own generator, `random.Random(FRESH_SEED)` (FRESH_SEED = 20271), for
results that no table on test.jsonl has seen. It leaves the files above byte-identical (they
come from `random.Random(SEED)` alone) and shares no message with them, not even a
near-identical one: no fresh message has the `near_key` of an earlier or another fresh one (the
text in lower case, without its opener, sign-off and punctuation, order numbers and other
numbers masked). The earlier files hold only some ways of writing a few situations (an account
question of medium urgency without an order number has none left), so its label mix is close
to, not exactly, the generator's (`fresh`). Select it on the command line, specs unchanged:

    python -m grammarrl.run task=custom task.spec=examples/support_tickets/triage.yaml \
        task.test=examples/support_tickets/test_fresh.jsonl
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 17  # demonstrations, train, dev, test (in that order)
FRESH_SEED = 20271  # test_fresh.jsonl only
FRESH_COUNT = 200
FRESH_TRIES = 20000

SMART = [
    "smart watch",
    "bluetooth speaker",
    "robot vacuum",
    "baby monitor",
    "security camera",
    "fitness tracker",
    "wireless keyboard",
    "video doorbell",
]
APPLIANCES = [
    "coffee grinder",
    "air fryer",
    "blender",
    "electric kettle",
    "toaster",
    "robot vacuum",
    "desk fan",
    "standing desk",
]
GOODS = [
    "yoga mat",
    "phone case",
    "hiking backpack",
    "water bottle",
    "office chair",
    "rain jacket",
    "desk lamp",
    "duvet cover",
    "cast iron pan",
    "suitcase",
]
PRODUCTS = sorted(set(SMART + APPLIANCES + GOODS))
SLOTS = {"{p}": PRODUCTS, "{s}": SMART, "{a}": APPLIANCES}
NAMES = [
    "Maria",
    "Tom",
    "Aisha",
    "Ken",
    "Lucia",
    "Dev",
    "Sophie",
    "Omar",
    "Hannah",
    "Jonas",
    "Priya",
    "Luis",
    "Mei",
    "Sam",
]

# (category, asks for a refund, text); {p} any product, {s} a smart device, {a} an appliance,
# {o} an order reference ({O} capitalised), {n} a number.
SITUATIONS = [
    ("billing", False, "I was charged twice for {o}. Can you check what happened?"),
    (
        "billing",
        True,
        ("My card was charged twice for the {p} in {o}, please refund the extra charge."),
    ),
    (
        "billing",
        False,
        ("The invoice for {o} shows the wrong VAT number, could you send a corrected one?"),
    ),
    (
        "billing",
        True,
        ("I cancelled my subscription last month but you billed me again. I want that money back."),
    ),
    (
        "billing",
        False,
        (
            "My payment keeps getting declined at checkout even though the card "
            "works everywhere else."
        ),
    ),
    (
        "billing",
        True,
        ("The discount code SPRING{n} was not applied to {o}, please refund the difference."),
    ),
    ("billing", False, "Can I pay for the {p} in three instalments?"),
    ("billing", False, "Why is there a {n} dollar service fee on my statement?"),
    ("shipping", False, "Where is my {p}? {O} was supposed to arrive on Monday."),
    ("shipping", False, "The tracking for {o} hasn't updated in five days."),
    ("shipping", False, "The courier says {o} was delivered but there is nothing at my door."),
    (
        "shipping",
        True,
        ("{O} arrived with the box crushed and the {p} is broken. I'd like a refund."),
    ),
    ("shipping", False, "Can you change the delivery address for {o}? I moved last week."),
    ("shipping", False, "Do you ship the {p} to Canada, and how long does it take?"),
    (
        "shipping",
        True,
        (
            "I paid for express shipping on {o} and it took two weeks. Please refund "
            "the shipping fee."
        ),
    ),
    ("shipping", False, "My {p} was left with a neighbour I don't know. How do I find it?"),
    ("technical", False, "The {s} won't connect to my wifi, it just keeps blinking red."),
    ("technical", False, "Your app crashes every time I open the settings page."),
    ("technical", False, "After the firmware update my {s} doesn't turn on anymore."),
    (
        "technical",
        True,
        ("The {s} from {o} stopped charging after two days. I want my money back."),
    ),
    ("technical", False, "I get an error 500 when I try to check out on the website."),
    ("technical", False, "How do I pair the {s} with a second phone?"),
    ("technical", False, "The {a} makes a loud clicking noise when it runs. Is that normal?"),
    ("technical", True, "Nothing I try fixes the {s}, I've reset it {n} times. Just refund me."),
    ("account", False, "I can't log in, the reset password email never arrives."),
    ("account", False, "Please change the email on my account to my new work address."),
    ("account", False, "I lost my phone and can't get past two-factor login."),
    ("account", False, "How do I delete my account and all my data?"),
    ("account", False, "Someone changed the password on my account, I think it was hacked."),
    ("account", False, "Can I merge my two accounts? My orders are split between them."),
    (
        "account",
        True,
        (
            "My account was closed by mistake with {n} dollars of store credit on it. "
            "Please pay that back to my card."
        ),
    ),
    ("returns", True, "The {p} I got in {o} is the wrong size. How do I return it for a refund?"),
    ("returns", False, "Can I exchange the {p} for a different colour?"),
    ("returns", False, "I need a return label for {o}."),
    (
        "returns",
        True,
        ("The {p} looks nothing like the photos. I'm sending it back, please refund me."),
    ),
    ("returns", False, "Is it too late to return something I bought {n} days ago?"),
    ("returns", True, "I sent back {o} three weeks ago and still haven't seen my refund."),
    (
        "returns",
        False,
        "You sent me two of the {p} but I only ordered one. How do I send one back?",
    ),
]
ORDER_FORMS = ["order {id}", "order #{id}", "my order {id}", "order number {id}"]
HIGH = [
    "This is urgent.",
    "I need this sorted today.",
    "Please help ASAP!",
    "This is the third time I'm writing about this.",
    "I need it before my trip tomorrow.",
]
LOW = ["No rush.", "Whenever you get a chance.", "Just wondering, no hurry.", "Not urgent at all."]
OPENERS = ["Hi,", "Hello,", "Hey there,", "Good morning,", "Hi team,", "Dear support,", "", "", ""]
CLOSERS = [
    "Thanks.",
    "Thank you!",
    "Thanks in advance.",
    "Cheers, {name}",
    "Regards, {name}",
    "- {name}",
    "",
    "",
]


def order_id(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
    return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randrange(10000, 100000)}"


def message(rng: random.Random) -> tuple[str, dict]:
    """One message and its ticket."""
    category, refund, text = rng.choice(SITUATIONS)
    number = None
    if "{o}" in text or "{O}" in text:
        number = order_id(rng)
        reference = rng.choice(ORDER_FORMS).format(id=number)
        text = text.replace("{o}", reference).replace("{O}", reference[0].upper() + reference[1:])
    elif rng.random() < 0.25:  # some messages give the order number in passing
        number = order_id(rng)
        text += rng.choice(
            [f" (order {number})", f" Order: {number}.", f" My order number is {number}."]
        )
    for slot, names in SLOTS.items():
        text = text.replace(slot, rng.choice(names))
    text = text.replace("{n}", str(rng.randrange(2, 60)))
    urgency = rng.choices(["low", "medium", "high"], weights=[1, 2, 1.5])[0]
    cue = {"low": rng.choice(LOW), "high": rng.choice(HIGH), "medium": ""}[urgency]
    parts = [rng.choice(OPENERS), text, cue, rng.choice(CLOSERS).format(name=rng.choice(NAMES))]
    style = rng.random()
    text = " ".join(part for part in parts if part)
    if style < 0.15:  # typed in a hurry (the order number keeps its form)
        text = text.lower().replace("'", "")
        text = text.replace(number.lower(), number) if number else text
    elif style < 0.25 and urgency == "high":  # shouting
        text = text.upper()
    ticket = {"category": category, "urgency": urgency, "order_id": number, "wants_refund": refund}
    return text, ticket


def generate(count: int, rng: random.Random, seen: set[str]) -> list[tuple[str, dict]]:
    out = []
    while len(out) < count:
        text, ticket = message(rng)
        if text not in seen:
            seen.add(text)
            out.append((text, ticket))
    return out


def write(path: Path, rows: list[tuple[str, dict]], labelled: int, tickets: bool = True) -> None:
    """The first `labelled` rows get their gold `triage` (and `ticket`, unless not `tickets`)."""
    with open(path, "w", encoding="utf-8") as handle:
        for i, (text, ticket) in enumerate(rows):
            gold = {"ticket": ticket} if tickets else {}
            record = {
                "message": text,
                **({**gold, "triage": triage(ticket)} if i < labelled else {}),
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")


def triage(ticket: dict) -> dict:
    """The two fields of the quick-start task (`triage.yaml`): category and order number."""
    return {"category": ticket["category"], "order_id": ticket["order_id"]}


def demonstrations(rng: random.Random, seen: set[str]) -> list[tuple[str, dict]]:
    """Three tickets of three categories: one with an order number and a refund, one urgent
    without an order number, one of low urgency."""
    wanted = [
        lambda t: t["order_id"] is not None and t["wants_refund"],
        lambda t: t["order_id"] is None and t["urgency"] == "high",
        lambda t: t["urgency"] == "low",
    ]
    chosen: list[tuple[str, dict]] = []
    while len(chosen) < len(wanted):
        text, ticket = message(rng)
        if (
            wanted[len(chosen)](ticket)
            and text not in seen
            and ticket["category"] not in {t["category"] for _, t in chosen}
        ):
            seen.add(text)
            chosen.append((text, ticket))
    return chosen


ORDER_ID = re.compile(r"\b[a-z]{2}-[0-9]{5}\b")
_NAME = "(?:" + "|".join(name.lower() for name in NAMES) + ")"
OPENER = re.compile("^(?:" + "|".join(re.escape(o.lower()) for o in OPENERS if o) + ") ")
CLOSER = re.compile(
    " (?:"
    + "|".join(re.escape(c.lower()).replace(re.escape("{name}"), _NAME) for c in CLOSERS if c)
    + ")$"
)


def near_key(text: str) -> str:
    """What two messages must not share to count as different: the text in lower case without
    its opener and sign-off, order numbers and other numbers masked, punctuation dropped."""
    text = CLOSER.sub("", OPENER.sub("", ORDER_ID.sub("#", text.lower().replace("'", ""))))
    text = re.sub(r"[0-9]+", "0", text)
    return " ".join(re.sub(r"[^a-z0-9#]+", " ", text).split())


def labels(ticket: dict) -> tuple:
    """A ticket's labels as the fresh draw keeps them: category, urgency, refund, order or not."""
    return (
        ticket["category"],
        ticket["urgency"],
        ticket["wants_refund"],
        ticket["order_id"] is None,
    )


def fresh(count: int, rng: random.Random, taken: set[str]) -> list[tuple[str, dict]]:
    """`count` messages whose `near_key` is not in `taken` (the earlier messages') nor shared
    among them, keeping the generator's label mix wherever it can rather than the mix of the
    messages that are left. Each row's labels are drawn as the generator draws them; its message
    is redrawn until one with those labels (`labels`) is new, else (after FRESH_TRIES draws: the
    generator has few ways to write, say, an account question of medium urgency without an
    order number) one with the same category and order-or-not, else the labels are skipped."""
    out: list[tuple[str, dict]] = []
    while len(out) < count:
        _, wanted = message(rng)
        for same in (labels, lambda t: (t["category"], t["order_id"] is None)):
            found = None
            for _ in range(FRESH_TRIES):
                text, ticket = message(rng)
                if same(ticket) == same(wanted) and near_key(text) not in taken:
                    found = (text, ticket)
                    break
            if found:
                taken.add(near_key(found[0]))
                out.append(found)
                break
    return out


def main(out: Path = HERE) -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    write(out / "demonstrations.jsonl", demonstrations(rng, seen), labelled=3)
    write(out / "train.jsonl", generate(240, rng, seen), labelled=60)
    write(out / "dev.jsonl", generate(30, rng, seen), labelled=30, tickets=False)
    write(out / "test.jsonl", generate(60, rng, seen), labelled=60)
    # the fresh test split: its own generator, after the files above (which it leaves as they were)
    taken = {near_key(text) for text in seen}
    rows = fresh(FRESH_COUNT, random.Random(FRESH_SEED), taken)
    write(out / "test_fresh.jsonl", rows, labelled=FRESH_COUNT)
    print(
        f"wrote demonstrations 3, train 240 (60 labelled), dev 30, test 60, "
        f"test_fresh {FRESH_COUNT} to {out}"
    )


if __name__ == "__main__":
    main()
