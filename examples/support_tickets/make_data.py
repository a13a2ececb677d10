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
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 17

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


def main(out: Path = HERE) -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    write(out / "demonstrations.jsonl", demonstrations(rng, seen), labelled=3)
    write(out / "train.jsonl", generate(240, rng, seen), labelled=60)
    write(out / "dev.jsonl", generate(30, rng, seen), labelled=30, tickets=False)
    write(out / "test.jsonl", generate(60, rng, seen), labelled=60)
    print(f"wrote demonstrations 3, train 240 (60 labelled), dev 30, test 60 to {out}")


if __name__ == "__main__":
    main()
