"""The reactions a bundle can answer with: a fixed set, chosen so that none commits to content.

Mining the corpus's most frequent short replies (models/reactions.py: `mine`)
gives "yes", "no", "true" and "right" alongside "haha": answers that agree
or disagree with whatever was said. Served as a fallback when retrieval is
unsure, they contradict the user as often as not ("my wife left me today" ->
"yes"). These classes are reactions to the kind of thing said, not to its
content: laughter, sympathy, congratulations, thanks, greetings.

Each class has its surface form in every language served and the chitchat
replies that count as an example of it (as `reaction_key` and
`near_duplicate_key` fold them: "sory" is "sorry" with its doubled letter
collapsed). The classifier learns which contexts call for which class from
those chitchat turns and from trigger lines we wrote in both languages
(models/data/reaction_triggers.jsonl); the student's vectors are aligned across
languages, so a Korean context finds the class its English twin would.
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


REACTION_CLASSES = (
    ReactionClass(
        "laugh",
        {"en": "haha", "ko": "ㅋㅋㅋ"},
        ("haha", "lol", "hehe", "oh haha", "haha that's funny"),
        stance="valence+",
    ),
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
    ReactionClass("wow", {"en": "wow", "ko": "우와"}, ("wow", "oh wow", "woah", "whoa", "oh my gosh", "omg")),
    ReactionClass(
        "welcome",
        {"en": "you're welcome!", "ko": "천만에!"},
        ("no problem", "you're welcome", "of course", "no worries", "anytime"),
    ),
    ReactionClass("thanks", {"en": "thank you!", "ko": "고마워!"}, ("thanks", "thank you", "haha thanks")),
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
    ReactionClass("really", {"en": "really?", "ko": "진짜?"}, ("really", "oh really", "seriously", "wait what")),
    ReactionClass("interesting", {"en": "interesting", "ko": "오 신기하다"}, ("interesting", "oh interesting")),
    ReactionClass("me_too", {"en": "me too!", "ko": "나도!"}, ("me too", "same", "same here", "yeah me too")),
    ReactionClass("good_luck", {"en": "good luck!", "ko": "화이팅!"}, ("good luck",)),
    ReactionClass(
        "i_see",
        {"en": "oh I see", "ko": "아 그렇구나"},
        ("oh ok", "oh okay", "i see", "ah i see", "oh i see", "gotcha", "oh gotcha", "that makes sense"),
    ),
    ReactionClass("you_too", {"en": "you too!", "ko": "너도!"}, ("you too", "thanks you too")),
)

# The axes a class can take a side on: [lines at the + pole, lines at the - pole], in every language
# served. Written as plain statements of each pole, not drawn from any set the reactions are judged on.
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
