"""Parallel lines: what every e5 build checks parity on, and how the translation checks pair languages."""

from __future__ import annotations

# The same eight chit-chat lines in seven languages (index i of each block is
# one meaning), then a few more scripts, code-switching, emoji and a 3-turn
# context. The parallel blocks double as a check that the weights are the
# model's: a mis-read layout still agrees with its own int8 export, but it
# does not pair a sentence with its translation.
PARALLEL = {
    "en": ["Hi! How are you doing today?", "What's your favourite food?", "I just got a new job!",
           "My cat is sick and I'm worried about her.", "Do you like dogs?",
           "Good night, sleep well!", "The weather is way too hot today.",
           "Have you seen any good movies lately?"],
    "ko": ["안녕! 오늘 어떻게 지내?", "제일 좋아하는 음식이 뭐야?", "나 방금 새 직장 구했어!",
           "우리 고양이가 아파서 걱정돼.", "강아지 좋아해?", "잘 자, 좋은 꿈 꿔!",
           "오늘 날씨 너무 덥다.", "요즘 재밌는 영화 본 거 있어?"],
    "ja": ["こんにちは!今日の調子はどう?", "一番好きな食べ物は何?", "新しい仕事が決まったよ!",
           "うちの猫が病気で心配なんだ。", "犬は好き?", "おやすみ、ぐっすり眠ってね!",
           "今日は暑すぎるね。", "最近何かいい映画見た?"],
    "es": ["¡Hola! ¿Cómo estás hoy?", "¿Cuál es tu comida favorita?",
           "¡Acabo de conseguir un trabajo nuevo!",
           "Mi gata está enferma y estoy preocupado por ella.", "¿Te gustan los perros?",
           "¡Buenas noches, que duermas bien!", "Hoy hace demasiado calor.",
           "¿Has visto alguna buena película últimamente?"],
    "de": ["Hallo! Wie geht es dir heute?", "Was ist dein Lieblingsessen?",
           "Ich habe gerade einen neuen Job bekommen!",
           "Meine Katze ist krank und ich mache mir Sorgen um sie.", "Magst du Hunde?",
           "Gute Nacht, schlaf gut!", "Heute ist es viel zu heiß.",
           "Hast du in letzter Zeit einen guten Film gesehen?"],
    "zh": ["嗨!你今天过得怎么样?", "你最喜欢的食物是什么?", "我刚找到一份新工作!",
           "我的猫生病了,我很担心她。", "你喜欢狗吗?", "晚安,睡个好觉!",
           "今天天气太热了。", "你最近看过什么好电影吗?"],
    "ar": ["مرحبا! كيف حالك اليوم؟", "ما هو طعامك المفضل؟", "لقد حصلت للتو على وظيفة جديدة!",
           "قطتي مريضة وأنا قلق عليها.", "هل تحب الكلاب؟", "تصبح على خير، نم جيدا!",
           "الطقس حار جدا اليوم.", "هل شاهدت أي أفلام جيدة مؤخرا؟"],
}  # fmt: skip
EXTRA = [
    "Je suis tellement fatigué aujourd'hui.",
    "Что ты делаешь на выходных?",
    "तुम कहाँ से हो?",
    "Bạn có thích đi du lịch không?",
    "Vamos ao cinema amanhã?",
    "오늘 meeting 너무 길었어 ㅋㅋㅋ",
    "lol 😂😂 that's hilarious",
    "ok",
    "did you watch the game last night? | yeah! what a finish, i couldn't believe that last goal"
    " | me neither, i was screaming at the tv the whole second half",
]
PARITY_TEXTS = [t for block in PARALLEL.values() for t in block] + EXTRA
