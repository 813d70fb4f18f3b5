"""Names the pair verifier's entity veto knows even when lower-cased, and the endings that
make a name's people or style of it. Hand-written lists of the language, as lexicon.py."""

# Names paraphrases keep: a lower-cased query still names them ("capital of france").
_NAMES = """afghanistan albania algeria argentina armenia australia austria bangladesh belgium
        bolivia brazil bulgaria cambodia canada chile china colombia croatia cuba cyprus czech
        denmark ecuador egypt england estonia ethiopia finland france georgia germany ghana
        greece hungary iceland india indonesia iran iraq ireland israel italy jamaica japan
        jordan kazakhstan kenya korea kuwait latvia lebanon libya lithuania luxembourg malaysia
        mexico mongolia morocco nepal netherlands holland nigeria norway pakistan peru
        philippines poland portugal qatar romania russia scotland serbia singapore slovakia
        slovenia somalia spain sudan sweden switzerland syria taiwan thailand tunisia turkey
        ukraine uruguay venezuela vietnam wales yemen zimbabwe america usa uk europe asia africa
        antarctica oceania london paris berlin madrid rome tokyo beijing shanghai moscow delhi
        mumbai sydney toronto chicago boston seattle dallas houston miami atlanta denver austin
        phoenix vancouver montreal dublin amsterdam brussels vienna prague warsaw budapest
        lisbon athens istanbul cairo dubai seoul bangkok singapore jakarta manila hanoi nairobi
        lagos lima bogota santiago python java javascript typescript rust golang ruby php perl
        swift kotlin scala haskell erlang elixir clojure lua matlab julia fortran cobol pascal
        dart groovy bash powershell c++ c# f# sql nosql html css react angular vue svelte django
        flask fastapi laravel nextjs nuxt nodejs deno numpy pandas pytorch tensorflow keras
        hadoop kafka redis postgres postgresql mysql sqlite mongodb oracle cassandra
        elasticsearch docker kubernetes terraform ansible jenkins git github gitlab bitbucket
        aws azure gcp linux windows macos mac ios android ubuntu debian fedora centos unix
        chrome firefox safari excel powerpoint outlook jira figma photoshop wordpress shopify
        salesforce sap google microsoft apple amazon meta facebook instagram twitter tiktok
        youtube netflix spotify uber airbnb tesla openai chatgpt gpt nvidia intel amd ibm
        samsung iphone ipad xbox playstation nintendo bitcoin ethereum monday tuesday wednesday
        thursday friday saturday sunday christianity islam judaism hinduism buddhism"""
GAZETTEER = frozenset(_NAMES.split())

# A name and the word for its people or its style ("Brazil" / "Brazilians", "Python" /
# "Pythonic") name the same thing; a longer name is never one of these ("Java" /
# "JavaScript").
DERIVED_NAME_SUFFIXES = ("n", "an", "ans", "ian", "ians", "ns", "ic", "ish", "ese")
