"""Line breaks in a message's Markdown: kept where the writer put them, as close as a line break, and never
added inside code."""
import pytest


def shown_lines(html: str) -> list[str]:
    from PySide6.QtGui import QTextDocument
    doc = QTextDocument()
    doc.setHtml(html)
    return doc.toPlainText().split("\n")


def test_a_pasted_traceback_keeps_the_line_after_an_indented_line_on_its_own(qapp):
    from app.markdown_text import markdown_html
    text = ("The error was:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "    foo()\nNameError: name 'foo' is not defined")
    lines = shown_lines(markdown_html(text))
    assert lines[-2:] == ["foo()", "NameError: name 'foo' is not defined"]       # not "foo() NameError: ..."


def test_an_indented_code_block_after_a_blank_line_is_left_as_written(qapp):
    from app.markdown_text import hard_breaks
    text = "Run this:\n\n    make\n    make install\n\nthen\n\tthis line\nand this"
    assert hard_breaks(text) == "Run this:\n\n    make\n    make install\n\nthen  \n\tthis line  \nand this"


@pytest.mark.parametrize("above", ["# Title", "***", "Title\n===", "- - -"])
def test_an_indented_code_block_after_a_heading_or_a_rule_is_left_as_written(qapp, above):
    from app.markdown_text import hard_breaks
    assert hard_breaks(f"{above}\n    code()\nafter").split("\n")[-2] == "    code()"


def test_two_lines_of_one_paragraph_stand_closer_than_two_paragraphs(qapp):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel

    from app.markdown_text import markdown_html

    def height(html: str) -> int:
        label = QLabel()
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setText(html)
        return label.heightForWidth(400)

    poem = markdown_html("Roses are red\nViolets are blue")
    assert shown_lines(poem) == ["Roses are red", "Violets are blue"]
    assert height(poem) < height(markdown_html("Roses are red\n\nViolets are blue"))
    assert height(poem) == height("<p style='margin-top:6px; margin-bottom:6px'>Roses are red<br/>Violets are blue</p>")
    assert height(markdown_html("Roses are red  \nViolets are blue")) == height(poem)   # a break written as Markdown
    assert height(markdown_html("Roses are red\\\nViolets are blue")) == height(poem)


def test_the_second_line_of_a_list_item_stays_in_its_item_and_each_quoted_line_is_marked(qapp):
    from app.markdown_text import QUOTE_BAR, markdown_html
    html = markdown_html("- one\n  still one\n- two")
    assert html.count("<li") == 2 and shown_lines(html) == ["one", "still one", "two"]
    assert shown_lines(markdown_html("> first\n> second")) == [f"{QUOTE_BAR} first", f"{QUOTE_BAR} second"]


FENCED = {
    "four backticks around three": "Look:\n````\ncode one\n```\ncode two\n````\nafter\nthe end",
    "tildes with an info string": "Look:\n~~~ {r}\ncode one\ncode two\n~~~\nafter\nthe end",
    "backticks with a language": "Look:\n```` python\ncode one\ncode two\n````\nafter\nthe end",
    "a fence in a block quote": "> Look:\n> ````\n> code one\n> code two\n> ````\n> after\n> the end",
    "a fence in a quote that ends": "> ```\n> code one\n> code two\nafter\nthe end",
}


@pytest.mark.parametrize("text", FENCED.values(), ids=FENCED.keys())
def test_code_in_a_fence_gets_no_added_spaces_and_the_text_after_it_keeps_its_breaks(qapp, text):
    from app.markdown_text import QUOTE_BAR, hard_breaks, markdown_html
    code = [line for line in hard_breaks(text).split("\n") if "code" in line]
    assert code and all(not line.endswith(" ") for line in code)
    lines = [line.lstrip(QUOTE_BAR + " ") for line in shown_lines(markdown_html(text))]
    assert "code one" in lines and lines[-2:] == ["after", "the end"]


def test_code_copied_from_a_four_backtick_fence_has_no_trailing_spaces(qtbot):
    from app.chat_view import block_widget
    from app.markdown_blocks import split_all
    labels = [block_widget(block) for block in split_all("Run:\n```` python\nx = 1\ny = 2\n````")]
    lines = [line for label in labels for line in shown_lines(label.text())]
    assert "x = 1" in lines and "y = 2" in lines


def test_underscores_are_italics_and_inline_code_is_in_the_code_boxes_font(qapp):
    # Qt's reader underlined _word_ and __word__ (read as links) and named a generic "monospace" family that a label's
    # rich text took for a font of that name: `code` showed in the text's own font
    from PySide6.QtGui import QFontInfo, QTextDocument
    from app.markdown_text import markdown_html
    doc = QTextDocument()
    doc.setHtml(markdown_html("_one_ *two* `three` [four](https://example.org) __five__"))
    formats = {}
    it = doc.begin().begin()
    while not it.atEnd():
        part = it.fragment()
        formats[part.text().strip()] = part.charFormat()
        it += 1
    assert formats["one"].fontItalic() and not formats["one"].fontUnderline()
    assert formats["two"].fontItalic()
    assert QFontInfo(formats["three"].font()).fixedPitch() and not QFontInfo(formats["one"].font()).fixedPitch()
    assert formats["four"].isAnchor()                      # a link is left as it is
    assert formats["five"].fontWeight() == 700 and not formats["five"].fontUnderline()      # bold, as **five**
