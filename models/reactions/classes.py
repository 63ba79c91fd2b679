"""The reactions a bundle can answer with, what kind of turn each answers, and how labelled emotions map to them.

One table, in three parts, read by the recipe (models/reactions/head.py), the gate
(bench/reaction_gate.py) and the tests, and shown in docs/reactions.md:

1. `REACTION_CLASSES`: a fixed set of short reactions, none of which commits to
   content ("yes", "true" would agree with whatever was said). Each has its
   text in every language served, its stance (a side it takes, served only
   where the turn leans that way), and its role: a *mirror* ("me too!",
   "you too!") answers only a turn that invites it; the *fallback* ("oh I
   see") answers when no class is sure, because it fits almost anything.
2. `KINDS`: the kinds of turn, each with the class it trains and the classes
   that fit it. A class that does not fit is *wrong* (`wrong`: a mirror
   nobody invited, anything but sympathy to bad news, sympathy to anything
   else, a greeting or farewell mid-conversation) or else *neutral*.
3. `EMOTION_LABELS`: each label of the emotion sets (GoEmotions, KOTE, NSMC)
   with the kind it stands for, if any, and its valence. A text's kind is
   the one kind its labels name (`text_kind`); its valence, the one sign
   they share (`text_valence`).

A class's chitchat examples (as `reaction_key` and `near_duplicate_key` fold
them: "Sorry!!" is "sorry") only name served text back to its class
(bench/ood.py); the classifier does not learn from chitchat replies.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReactionClass:
    name: str
    surface: dict[str, str]  # BCP 47 -> what is served in a conversation in that language
    # Chitchat replies that count as an example of the class, spelt plainly: they are
    # compared as `near_duplicate_key(reaction_key(...))` folds them ("Sorry!!" = "sorry").
    examples: tuple[str, ...]
    # The side the class takes on a STANCE_AXES axis, "" for none: served only where the context leans that way.
    stance: str = ""
    # "mirror": says the user's feeling back, served only to a turn that invites it (a high floor);
    # "fallback": served when no class is sure; "" for the rest.
    role: str = ""


REACTION_CLASSES = (
    ReactionClass(
        "sympathy",
        {"en": "oh no, I'm sorry", "ko": "헐 어떡해 ㅠㅠ"},
        ("oh no", "sorry", "i'm sorry", "that sucks", "oh man", "ugh", "aw", "ouch", "yikes", "that's terrible"),
        stance="valence-",
    ),
    ReactionClass(
        "congrats", {"en": "congrats!", "ko": "축하해!"}, ("congrats", "congratulations", "yay"), stance="valence+"
    ),
    ReactionClass(
        "great",
        {"en": "that's awesome!", "ko": "와 잘됐다!"},
        ("that's awesome", "awesome", "that's great", "that's amazing", "that sounds awesome", "that's good", "great"),
        stance="valence+",
    ),
    ReactionClass(
        "cool",
        {"en": "oh nice!", "ko": "오 좋다!"},
        ("nice", "oh nice", "cool", "oh cool", "that's cool", "haha nice", "sweet"),
        stance="valence+",
    ),
    # Laughter takes no side: a joke is often a mishap ("I walked into a glass door"), which reads as
    # a little bad. The bad-news guard keeps it from a turn that leans to bad news.
    ReactionClass("laugh", {"en": "haha", "ko": "ㅋㅋㅋ"}, ("haha", "lol", "hehe", "oh haha", "haha that's funny")),
    ReactionClass(
        "welcome",
        {"en": "you're welcome!", "ko": "천만에!"},
        ("no problem", "you're welcome", "of course", "no worries", "anytime"),
    ),
    ReactionClass("thanks", {"en": "thank you!", "ko": "고마워!"}, ("thanks", "thank you", "haha thanks")),
    ReactionClass("really", {"en": "really?", "ko": "진짜?"}, ("really", "oh really", "seriously", "wait what")),
    ReactionClass("good_luck", {"en": "good luck!", "ko": "화이팅!"}, ("good luck",)),
    ReactionClass(
        "hello",
        {"en": "hi!", "ko": "안녕!"},
        ("hi", "hello", "hey", "hey there", "hi there", "oh hey", "hi again", "hey again"),
        stance="phase+",
    ),
    ReactionClass(
        "how_are_you",
        {"en": "how are you?", "ko": "잘 지냈어?"},
        ("how are you", "how's it going", "what's up", "hey what's up", "how are you doing", "hey how are you"),
        stance="phase+",
    ),
    ReactionClass(
        "bye", {"en": "bye!", "ko": "잘 가!"}, ("bye", "see ya", "see you", "talk to you later"), stance="phase-"
    ),
    ReactionClass(
        "good_night", {"en": "good night!", "ko": "잘 자!"}, ("good night", "night", "goodnight"), stance="phase-"
    ),
    ReactionClass(
        "me_too", {"en": "me too!", "ko": "나도!"}, ("me too", "same", "same here", "yeah me too"), role="mirror"
    ),
    ReactionClass("you_too", {"en": "you too!", "ko": "너도!"}, ("you too", "thanks you too"), role="mirror"),
    ReactionClass(
        "i_see",
        {"en": "oh I see", "ko": "아 그렇구나"},
        ("oh ok", "oh okay", "i see", "ah i see", "oh i see", "gotcha", "oh gotcha", "that makes sense"),
        role="fallback",
    ),
)
CLASS_NAMES = tuple(c.name for c in REACTION_CLASSES)
FALLBACK = next(c.name for c in REACTION_CLASSES if c.role == "fallback")
MIRRORS = frozenset(c.name for c in REACTION_CLASSES if c.role == "mirror")
# Reactions that are amazed or say the user's words back: never the answer to a turn nothing is sure
# about. "wow" and "우와" are not classes; they are listed so that no bundle brings them back.
NEVER_UNSURE = frozenset({"wow", "우와", "me too!", "나도!", "you too!", "너도!"})


@dataclass(frozen=True)
class Kind:
    """A kind of turn: the class the recipe trains on turns of this kind, and the classes that fit it."""

    trains: str  # the class a turn of this kind teaches
    fits: frozenset[str]
    valence: int = 0  # +1 good, -1 bad, 0 neither: the side a text of this kind must lean to


def _kind(trains: str, fits: set[str], valence: int = 0) -> Kind:
    return Kind(trains, frozenset(fits), valence)


KINDS = {
    "bad_news": _kind("sympathy", {"sympathy"}, -1),  # loss, failure, illness, sadness
    "good_news": _kind("great", {"great", "congrats", "cool"}, +1),  # joy, relief, excitement
    "achievement": _kind("congrats", {"congrats", "great", "cool"}, +1),  # pride: something done
    "thanks": _kind("welcome", {"welcome"}, +1),
    "joke": _kind("laugh", {"laugh"}, +1),  # amusement
    "surprise": _kind("really", {"really"}),  # surprise, curiosity
    "compliment": _kind("thanks", {"thanks"}, +1),  # something nice said to the bot
    "plan": _kind("good_luck", {"good_luck"}),  # an exam, an interview, a race ahead
    "greeting": _kind("hello", {"hello", "how_are_you"}),
    "goodbye": _kind("bye", {"bye", "good_night"}),
    "wish": _kind("you_too", {"you_too", "thanks"}),  # "have a nice day": the one turn "you too!" answers
    # A liking or a feeling the bot could share ("I love rainy days", "I'm starving"): what "me too!" answers.
    "liking": _kind("me_too", {"me_too"}),
    "statement": _kind(FALLBACK, {FALLBACK}),  # plain talk, news of no clear side
}
OPENING = frozenset({"hello", "how_are_you"})  # fit only a greeting
CLOSING = frozenset({"bye", "good_night"})  # fit a goodbye; neutral to a wish ("have a good night!")


def wrong(kind: str, served: str) -> bool:
    """Whether `served`, which does not fit a turn of `kind`, is wrong for it: a mirror nobody invited
    ("me too!" to news of the user's own life), anything but sympathy or the fallback to bad news
    (cheerful, amazed, thankful), sympathy to anything else (a contradiction), or a greeting or
    farewell where the conversation is neither starting nor ending."""
    if served in MIRRORS or served == "sympathy" or served in OPENING:
        return True
    if kind == "bad_news":
        return served != FALLBACK
    return served in CLOSING and kind != "wish"


def verdict(kind: str, served: str | None) -> str:
    """ "fits", "neutral" or "wrong": how the class `served` (a name in CLASS_NAMES; None: no
    reaction, which is neutral) answers a turn of `kind`."""
    if served is None:
        return "neutral"
    if served in KINDS[kind].fits:
        return "fits"
    return "wrong" if wrong(kind, served) else "neutral"


# label -> (kind or "", valence): the kind a label stands for, "" for none (it still lends its valence).
EMOTION_LABELS: dict[str, dict[str, tuple[str, int]]] = {
    "goemotions": {
        "sadness": ("bad_news", -1),
        "grief": ("bad_news", -1),
        "disappointment": ("bad_news", -1),
        "remorse": ("bad_news", -1),
        "joy": ("good_news", +1),
        "relief": ("good_news", +1),
        "excitement": ("good_news", +1),
        "pride": ("achievement", +1),
        "gratitude": ("thanks", +1),
        "amusement": ("joke", +1),
        "surprise": ("surprise", 0),
        "curiosity": ("surprise", 0),
        "neutral": ("statement", 0),
        "admiration": ("", +1),
        "approval": ("", +1),
        "caring": ("", +1),
        "desire": ("", +1),
        "love": ("", +1),
        "optimism": ("", +1),
        "anger": ("", -1),
        "annoyance": ("", -1),
        "disapproval": ("", -1),
        "disgust": ("", -1),
        "embarrassment": ("", -1),
        "fear": ("", -1),
        "nervousness": ("", -1),
        "confusion": ("", 0),
        "realization": ("", 0),
    },
    # KOTE's 44 labels (Korean online comments). Its labels are dense (7.9 a text); "안타까움/실망"
    # (pity or disappointment) tags 44% of texts, angry ones too, so it lends only its valence.
    "kote": {
        "슬픔": ("bad_news", -1),  # sadness
        "절망": ("bad_news", -1),  # despair
        "서러움": ("bad_news", -1),  # sorrow, feeling wronged
        "힘듦/지침": ("bad_news", -1),  # worn out
        "패배/자기혐오": ("bad_news", -1),  # defeat, self-loathing
        "죄책감": ("bad_news", -1),  # guilt (GoEmotions' remorse)
        "기쁨": ("good_news", +1),  # joy
        "행복": ("good_news", +1),  # happiness
        "뿌듯함": ("achievement", +1),  # pride
        "고마움": ("thanks", +1),  # gratitude
        "놀람": ("surprise", 0),  # surprise
        "신기함/관심": ("surprise", 0),  # curiosity, interest
        "없음": ("statement", 0),  # no emotion
        "안타까움/실망": ("", -1),
        "불쌍함/연민": ("", -1),  # pity for someone else
        "불평/불만": ("", -1),
        "어이없음": ("", -1),
        "짜증": ("", -1),
        "화남/분노": ("", -1),
        "의심/불신": ("", -1),
        "한심함": ("", -1),
        "증오/혐오": ("", -1),
        "지긋지긋": ("", -1),
        "우쭐댐/무시함": ("", -1),
        "역겨움/징그러움": ("", -1),
        "재미없음": ("", -1),
        "부담/안_내킴": ("", -1),
        "귀찮음": ("", -1),
        "경악": ("", -1),
        "공포/무서움": ("", -1),
        "불안/걱정": ("", -1),
        "당황/난처": ("", -1),
        "부끄러움": ("", -1),
        "즐거움/신남": ("", +1),  # fun, excitement: on KOTE mostly laughter at a post, not news
        "안심/신뢰": ("", +1),
        "감동/감탄": ("", +1),
        "흐뭇함(귀여움/예쁨)": ("", +1),
        "환영/호의": ("", +1),
        "존경": ("", +1),
        "편안/쾌적": ("", +1),
        "기대감": ("", +1),
        "아껴주는": ("", +1),
        "비장함": ("", 0),  # determination
        "깨달음": ("", 0),  # realization
    },
    "nsmc": {"positive": ("", +1), "negative": ("", -1)},  # movie reviews: polarity only
}
EMOTION_LABELS["goemotions_ko_mt"] = EMOTION_LABELS["goemotions"]  # the same labels, machine-translated text


def text_valence(source: str, labels: list[str]) -> int:
    """+1 or -1 when every label with a valence agrees, and one has one; 0 otherwise."""
    signs = {EMOTION_LABELS[source][label][1] for label in labels} - {0}
    return signs.pop() if len(signs) == 1 else 0


def text_kind(source: str, labels: list[str]) -> str:
    """The one kind the labels name, "" if none or several, or if the text's valence is not the kind's.
    "statement" only for a text labelled with nothing but it (GoEmotions' neutral, KOTE's 없음)."""
    table = EMOTION_LABELS[source]
    kinds = {table[label][0] for label in labels} - {""}
    if len(kinds) != 1:
        return ""
    kind = kinds.pop()
    if kind == "statement":
        return kind if len(labels) == 1 else ""
    valence = text_valence(source, labels)
    want = KINDS[kind].valence
    return kind if valence == want or (want == 0 and valence == 0) else ""


# The axes a class can take a side on: [lines at the + pole, lines at the - pole], in every language
# served. "phase" places greetings against farewells (the difference of the poles' mean vectors);
# "valence" is learned from labelled emotions by the recipe, and these lines join its training texts.
# Written as plain statements of each pole, not drawn from any set the reactions are judged on.
STANCE_AXES = {
    "valence": [
        [
            "I have some good news",
            "something wonderful happened to me",
            "I'm so happy",
            "I'm having a great day",
            "I won it",
            "I finally did it",
            "좋은 소식이 있어",
            "나한테 정말 좋은 일이 생겼어",
            "너무 행복해",
            "오늘 최고의 하루였어",
            "드디어 해냈어",
        ],
        [
            "I have some bad news",
            "something terrible happened to me",
            "I'm so sad",
            "I'm having an awful day",
            "I lost it",
            "I'm sick and in pain",
            "안 좋은 소식이 있어",
            "나한테 끔찍한 일이 생겼어",
            "너무 슬퍼",
            "오늘 최악의 하루였어",
            "나 아파",
        ],
    ],
    "phase": [
        [
            "hi! how have you been?",
            "good morning",
            "hey, long time no see",
            "안녕! 잘 지냈어?",
            "좋은 아침",
            "오랜만이야",
        ],
        [
            "bye, talk to you later",
            "good night, I'm going to bed",
            "I have to go now, see you",
            "잘 자",
            "이제 가볼게, 다음에 또 얘기하자",
            "나 이제 갈게",
        ],
    ],
}
