// The Jinja interpreter statement by statement: each case's expected text is what jinja2
// 3.1 renders for it in transformers' environment (ImmutableSandboxedEnvironment,
// trim_blocks, lstrip_blocks, loopcontrols, transformers' tojson).
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace strata::tokenizer {
namespace {

struct RenderCase {
  const char* tmpl;
  const char* expected;
};

// Every case renders with these globals.
const char* kContext = R"({"xs": [1, 2, 3], "d": {"a": 1, "b": "x"}, "s": "héllo", "n": null, "ws": "  a b  ",
  "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";

const RenderCase kStatementsCases[] = {
    {R"J({% if 0 %}a{% elif [] %}b{% elif 'x' %}c{% else %}d{% endif %})J",
     R"J(c)J"},
    {R"J({% if none %}a{% else %}b{% endif %})J",
     R"J(b)J"},
    {R"J({% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %})J",
     R"J(10TrueFalse221;21FalseTrue210;)J"},
    {R"J({% for x in xs %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %})J",
     R"J([|2][1|3][2|])J"},
    {R"J({% for x in xs %}{{ loop.cycle('a', 'b') }}{{ loop.changed(x > 1) }}{% endfor %})J",
     R"J(aTruebTrueaFalse)J"},
    {R"J({% for x in [] %}a{% else %}empty{% endfor %})J",
     R"J(empty)J"},
    {R"J({% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %})J",
     R"J(2:1/2 3:2/2 )J"},
    {R"J({% for x in xs if x > 5 %}{{ x }}{% else %}none{% endfor %})J",
     R"J(none)J"},
    {R"J({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %})J",
     R"J(a=1;b=x;)J"},
    {R"J({% for k, v in d|items %}{{ k }}={{ v }};{% endfor %})J",
     R"J(a=1;b=x;)J"},
    {R"J({% for k in d %}{{ k }}{% endfor %}{% for c in 'héllo' %}{{ c }}.{% endfor %})J",
     R"J(abh.é.l.l.o.)J"},
    {R"J({% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %})J",
     R"J(1)J"},
    {R"J({% for x in xs %}{% for y in xs %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }}{% endfor %};{% endfor %})J",
     R"J(11;21;31;)J"},
    {R"J({% for x in xs %}{% set inner = x %}{% endfor %}[{{ inner }}])J",
     R"J([])J"},
    {R"J({% set x = 1 %}{% for i in xs %}{{ x }}{% set x = i * 10 %}{{ x }} {% endfor %}{{ x }})J",
     R"J(110 120 130 1)J"},
    {R"J({% if true %}{% set z = 3 %}{% endif %}{{ z }})J",
     R"J(3)J"},
    {R"J({% set ns = namespace(total=0, seen=false) %}{% for x in xs %}{% set ns.total = ns.total + x %}{% endfor %}{{ ns.total }} {{ ns.seen }} {{ ns.missing is defined }})J",
     R"J(6 False False)J"},
    {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }})J",
     R"J(12(1, 2))J"},
    {R"J({% set blk %}  inner {{ 1 + 1 }} {% endset %}[{{ blk }}])J",
     R"J([  inner 2 ])J"},
    {R"J({% set blk | upper %}abc{% endset %}{{ blk }})J",
     R"J(ABC)J"},
    {R"J({% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('A', 'Hi') }} {{ greet('C', punct='?') }})J",
     R"J(Hello, Bob! Hi, A! Hello, C?)J"},
    {R"J({% macro f(a) %}[{{ a }}]{% endmacro %}{{ f() }}{{ f(none) }})J",
     R"J([][None])J"},
    {R"J({% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(3) }})J",
     R"J(3210)J"},
    {R"J({% set y = 5 %}{% macro m() %}{{ y }}{% endmacro %}{{ m() }})J",
     R"J(5)J"},
    {R"J({% filter upper %}hello {{ 'x' }}{% endfilter %})J",
     R"J(HELLO X)J"},
    {R"J({% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}])J",
     R"J(3[])J"},
    {R"J({% raw %}{{ not parsed }}{% if %}{% endraw %})J",
     R"J({{ not parsed }}{% if %})J"},
    {R"J({{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(5, 0, -2)|list }}{{ dict(a=1, b=2) }})J",
     R"J([0, 1, 2][1, 3, 5][5, 3, 1]{'a': 1, 'b': 2})J"},
    {R"J({% set ns = namespace(d) %}{{ ns.a }}{{ ns.b }})J",
     R"J(1x)J"},
};

const RenderCase kFiltersCases[] = {
    {R"J({{ ws|trim }}|{{ 'xxaxx'|trim('x') }})J",
     R"J(a b|a)J"},
    {R"J({{ xs|length }}{{ s|length }}{{ d|length }}{{ undefined_name|length }}{{ xs|count }})J",
     R"J(35203)J"},
    {R"J({{ xs|first }}{{ xs|last }}{{ s|first }}{{ s|last }}[{{ []|first }}])J",
     R"J(13ho[])J"},
    {R"J({{ d|items|list }})J",
     R"J([('a', 1), ('b', 'x')])J"},
    {R"J({{ xs|join(',') }}|{{ xs|join }}|{{ msgs|join('|', attribute='role') }})J",
     R"J(1,2,3|123|user|assistant)J"},
    {R"J({{ missing|default('dft') }}|{{ ''|default('dft') }}|{{ ''|default('dft', true) }}|{{ 0|d('z', boolean=true) }}|{{ n|default('x') }})J",
     R"J(dft||dft|z|None)J"},
    {R"J({{ xs|string }}{{ 1|string }}{{ none|string }})J",
     R"J([1, 2, 3]1None)J"},
    {R"J({{ 'hello wOrld'|upper }} {{ 'HeLLo'|lower }} {{ 'hello wOrld-foo(bar'|title }} {{ 'hELLO world'|capitalize }})J",
     R"J(HELLO WORLD hello Hello World-Foo(Bar Hello world)J"},
    {R"J({{ 'aaa'|replace('a', 'b') }}{{ 'aaa'|replace('a', 'b', 2) }})J",
     R"J(bbbbba)J"},
    {R"J({{ 'abc'|list }}{{ d|list }})J",
     R"J(['a', 'b', 'c']['a', 'b'])J"},
    {R"J({{ msgs|map(attribute='role')|list }}{{ ['1', '2']|map('int')|list }}{{ msgs|map(attribute='nope', default='D')|list }})J",
     R"J(['user', 'assistant'][1, 2]['D', 'D'])J"},
    {R"J({{ xs|select('odd')|list }}{{ xs|reject('odd')|list }}{{ [0, 1, '', none, 'a']|select|list }})J",
     R"J([1, 3][2][1, 'a'])J"},
    {R"J({{ msgs|selectattr('role', 'equalto', 'user')|list }}{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}{{ xs|select('>', 1)|list }})J",
     R"J([{'role': 'user', 'content': 'hi'}]['yo'][2, 3])J"},
    {R"J({{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ true|int }} {{ ' 12 '|int }})J",
     R"J(42 4 0 7 3 26 1 12)J"},
    {R"J({{ '4.5'|float }} {{ 'x'|float }} {{ 3|float }} {{ -3|abs }} {{ -3.5|abs }})J",
     R"J(4.5 0.0 3.0 3 3.5)J"},
    {R"J({{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3.14159|round(2, 'floor') }} {{ 3.14159|round(1, 'ceil') }} {{ 5|round }})J",
     R"J(2.0 4.0 2.67 3.14 3.2 5)J"},
    {R"J({{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'a\nb'|indent('> ') }})J",
     R"J(a
    b

    c|  a
  b|a
  
  b|a
> b)J"},
    {R"J({{ 'hello big-world foo_bar 3x'|wordcount }})J",
     R"J(5)J"},
    {R"J({{ ['a', 'A', 'b', 1, 1]|unique|list }}{{ ['a', 'A', 'b']|unique(true)|list }})J",
     R"J(['a', 'b', 1]['a', 'A', 'b'])J"},
    {R"J({{ [3, 1, 2]|sort }}{{ ['b', 'A', 'c']|sort }}{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}{{ [3, 1, 2]|sort(reverse=true) }}{{ msgs|sort(attribute='role')|map(attribute='role')|list }})J",
     R"J([1, 2, 3]['A', 'b', 'c']['A', 'b', 'c'][3, 2, 1]['assistant', 'user'])J"},
    {R"J({{ {'b': 1, 'a': 2}|dictsort }}{{ {'b': 1, 'a': 2}|dictsort(by='value') }}{{ {'b': 1, 'a': 2}|dictsort(reverse=true) }})J",
     R"J([('a', 2), ('b', 1)][('b', 1), ('a', 2)][('b', 1), ('a', 2)])J"},
    {R"J({{ xs|sum }} {{ [1.5, 2]|sum }} {{ xs|sum(start=10) }} {{ xs|min }} {{ xs|max }} {{ ['b', 'A']|min }} {{ ['b', 'A']|max }})J",
     R"J(6 3.5 16 1 3 A b)J"},
    {R"J({{ [1, 2, 3, 4, 5]|batch(2)|list }}{{ [1, 2, 3]|batch(2, 'x')|list }})J",
     R"J([[1, 2], [3, 4], [5]][[1, 2], [3, 'x']])J"},
    {R"J({{ xs|reverse|list }}{{ 'abc'|reverse }})J",
     R"J([3, 2, 1]cba)J"},
    {R"J({{ '<a href="x">&'|e }} {{ '%s-%d'|format('a', 3) }} {{ '%05.1f|%x|%r'|format(3.14159, 255, 'q') }})J",
     R"J(&lt;a href=&#34;x&#34;&gt;&amp; a-3 003.1|ff|'q')J"},
    {R"J({{ 'ok'|safe }}{{ d|attr('a') }}{{ 'x'|center(5) }})J",
     R"J(ok  x  )J"},
};

const RenderCase kTojsonCases[] = {
    {R"J({{ 'x'|tojson }}{{ {'a': [1, 2.5, none, true, 'é']}|tojson }})J",
     R"J("x"{"a": [1, 2.5, null, true, "é"]})J"},
    {R"J({{ {'a': [1, {'b': []}], 'c': {}}|tojson(indent=2) }})J",
     R"J({
  "a": [
    1,
    {
      "b": []
    }
  ],
  "c": {}
})J"},
    {R"J({{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ 'é\n\x01"\\'|tojson }}{{ 'é😀'|tojson(ensure_ascii=true) }})J",
     R"J({"a": 2, "b": 1}"é\n\u0001\"\\""\u00e9\ud83d\ude00")J"},
    {R"J({{ [1, 2]|tojson(separators=(',', ':')) }}{{ {'a': 1}|tojson(indent='\t') }})J",
     R"J([1,2]{
	"a": 1
})J"},
    {R"J({{ msgs|tojson }}{{ 1.0|tojson }}{{ 1e20|tojson }})J",
     R"J([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]1.01e+20)J"},
};

const RenderCase kTestsCases[] = {
    {R"J({{ u is defined }}{{ xs is defined }}{{ u is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ xs is mapping }})J",
     R"J(FalseTrueTrueTrueTrueTrueFalse)J"},
    {R"J({{ xs is iterable }}{{ 1 is iterable }}{{ u is iterable }}{{ s is sequence }}{{ 1 is number }}{{ true is number }}{{ 1.5 is number }}{{ 's' is number }})J",
     R"J(TrueFalseTrueTrueTrueTrueTrueFalse)J"},
    {R"J({{ 1 is integer }}{{ true is integer }}{{ 1.0 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }})J",
     R"J(TrueFalseFalseTrueTrueFalseTrueFalseTrueFalse)J"},
    {R"J({{ 1 is equalto 1 }}{{ 1 is eq 2 }}{{ 'a' is in 'cat' }}{{ 2 is in xs }}{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }})J",
     R"J(TrueFalseTrueTrueTrueFalseTrueFalse)J"},
    {R"J({{ 1 is not none }}{{ not 1 is none }}{{ xs is not string }}{{ 5 is lt 6 }}{{ 5 is ge 5 }}{{ 'A' is upper }}{{ 'a' is lower }})J",
     R"J(TrueTrueTrueTrueTrueTrueTrue)J"},
};

const RenderCase kOperatorsCases[] = {
    {R"J({{ 'a' ~ 1 ~ none ~ u ~ [1] }}|{{ 'ab' in 'cabd' }}{{ 'z' not in 'abc' }}{{ 1 in xs }}{{ 'a' in d }}{{ 'zz' in u }})J",
     R"J(a1None[1]|TrueTrueTrueTrueFalse)J"},
    {R"J({{ 1 and 2 }}{{ 0 and 2 }}{{ 0 or 'x' }}{{ '' or [] }}{{ not 0 }}{{ not [] }}|{{ none or u }}|)J",
     R"J(20x[]TrueTrue||)J"},
    {R"J({{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ (1, 2) == [1, 2] }}{{ 1 != 2 }}{{ true == 1 }})J",
     R"J(TrueFalseTrueTrueTrueFalseTrueTrue)J"},
    {R"J({{ 'ab' * 3 }}{{ 3 * 'x' }}{{ [1] * 3 }}[{{ 'a' * -1 }}]{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 1 + 2.5 }}{{ 10 - 2 * 3 }}{{ (10 - 2) * 3 }})J",
     R"J(abababxxx[1, 1, 1][]ab[1, 2]3.5424)J"},
    {R"J({{ 2**3**2 }} {{ -2**2 }} {{ 7//-2 }} {{ -7 % 3 }} {{ 1/2 }} {{ 4/2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 10 % -3 }} {{ 2 ** -1 }})J",
     R"J(64 4 -4 2 0.5 2.0 3.0 0.5 -2 0.5)J"},
    {R"J({{ 'yes' if xs else 'no' }}{{ 'yes' if [] else 'no' }}[{{ 'yes' if 0 }}]{{ 1 if 0 else 2 if 0 else 3 }})J",
     R"J(yesno[]3)J"},
    {R"J({{ -(xs|length) }}{{ -1|abs }}{{ not true and false }}{{ 1_000 }} {{ 0.5e1 }} {{ 'a' 'b' }} {{ True }}{{ False }}{{ None }})J",
     R"J(-31False1000 5.0 ab TrueFalseNone)J"},
};

const RenderCase kSlicingCases[] = {
    {R"J({{ 'abc'[::-1] }}{{ xs[::-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::2] }}{{ s[1:3] }}{{ s[-1] }}{{ xs[-1] }}[{{ xs[5] }}]{{ 'abcdef'[5:1:-2] }})J",
     R"J(cba[3, 2, 1][2, 3][1, 2][1, 3]élo3[]fd)J"},
    {R"J({{ xs[0:10] }}{{ xs[-10:] }}{{ xs[1:-1] }}{{ xs[::-2] }}{{ xs[-1:0:-1] }}{{ (1, 2, 3)[1:] }})J",
     R"J([1, 2, 3][1, 2, 3][2][3, 1][3, 2](2, 3))J"},
    {R"J({{ 'ünïcode'|upper }} {{ 'ünïcode'|length }} {{ 'ünïcode'[1] }} {{ 'ünïcode'[1:3] }} {{ 'ünïcode'|reverse }})J",
     R"J(ÜNÏCODE 7 n nï edocïnü)J"},
};

const RenderCase kAccessCases[] = {
    {R"J({{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}{{ d.keys()|list }}{{ d['a'] }}{{ d.a }}[{{ d['zz'] }}{{ d.zz }}]{{ msgs[0].role }}{{ msgs[0]['content'] }}{{ msgs.0.role }})J",
     R"J(1None9['a', 'b']11[]userhiuser)J"},
    {R"J([{{ n.foo }}|{{ n[0] }}]{{ msgs[5] is defined }}{{ (msgs|last).content }})J",
     R"J([|]Falseyo)J"},
    {R"J({{ s.startswith('hé') }}{{ s.endswith('lo') }}{{ s.startswith(('x', 'h')) }}{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b c '.rsplit(None, 1) }})J",
     R"J(TrueTrueTrue['a', 'b', '', 'c']['a', 'b']['a', 'b,c']['a,b', 'c'][' a b', 'c'])J"},
    {R"J({{ s.upper() }}{{ 'ABC'.lower() }}{{ 'abc'.find('c') }}{{ 'héllo'.find('l') }}{{ 'abc'.find('z') }}{{ 'aXbXc'.count('X') }}{{ '{} and {}'.format('a', 1) }}{{ '{x}!'.format(x=2) }})J",
     R"J(HÉLLOabc22-12a and 12!)J"},
    {R"J({{ ws.strip() }}|{{ ws.lstrip() }}|{{ ws.rstrip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'hello world'.title() }}|{{ 'aaa'.replace('a', 'b', 1) }}|{{ ', '.join(['x', 'y']) }})J",
     R"J(a b|a b  |  a b|a|Hello World|baa|x, y)J"},
    {R"J({{ 'line1\nline2\r\nline3'.splitlines() }}{{ 'Hello'.isupper() }}{{ '123'.isdigit() }}{{ '  '.isspace() }})J",
     R"J(['line1', 'line2', 'line3']FalseTrueTrue)J"},
    {R"J({{ "a%sb" % 1 }}{{ "%s and %s" % (1, 2) }}{{ "%(x)s" % {'x': 5} }})J",
     R"J(a1b1 and 25)J"},
};

const RenderCase kPrintingCases[] = {
    {R"J({{ [1, 'a', none, true, 1.5, {'k': (1, 2)}] }})J",
     R"J([1, 'a', None, True, 1.5, {'k': (1, 2)}])J"},
    {R"J({{ d.items() }}|{{ d.keys() }}|{{ d.values() }}|{{ (1,) }}{{ () }})J",
     R"J(dict_items([('a', 1), ('b', 'x')])|dict_keys(['a', 'b'])|dict_values([1, 'x'])|(1,)())J"},
    {R"J({{ "it's" }} {{ ['it\'s', "a\"b", "both'\""] }} {{ ['tab\there', 'nl\n', 'é', '\x00'] }})J",
     R"J(it's ["it's", 'a"b', 'both\'"'] ['tab\there', 'nl\n', 'é', '\x00'])J"},
    {R"J({{ 1e20 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 10**15 * 1.0 }} {{ 1e16 }} {{ 1.0 }} {{ -0.0 }} {{ 3.14 }} {{ 1e-7 }} {{ 0.0001 }})J",
     R"J(1e+20 1.5e-05 0.30000000000000004 1000000000000000.0 1e+16 1.0 -0.0 3.14 1e-07 0.0001)J"},
    {R"J([{{ none }}][{{ undefined_thing }}][{{ true }}][{{ {} }}][{{ [] }}])J",
     R"J([None][][True][{}][[]])J"},
    {R"J({% set ns = namespace(a=1) %}{{ ns }})J",
     R"J(<Namespace {'a': 1}>)J"},
};

const RenderCase kWhitespaceCases[] = {
    {R"J(line1
  {% if true %}
  indented
  {% endif %}
end
)J",
     R"J(line1
  indented
end)J"},
    {R"J(  {%- if true %}
 x
  {%+ endif %}
 y 
)J",
     R"J( x
   y )J"},
    {R"J({% for m in msgs %}
  {{ m.role }}
  {% if not loop.last %}
,
  {% endif %}
{% endfor %}
)J",
     R"J(  user
,
  assistant
)J"},
    {R"J({% for m in msgs -%}
  {{ m.role }}
{%- endfor %})J",
     R"J(userassistant)J"},
    {R"J(a
{# comment #}
b
  {# c2 #}  
c)J",
     R"J(a
b
  
c)J"},
    {R"J(a  {#- c -#}  
  b)J",
     R"J(ab)J"},
    {R"J({% raw -%}
  {{ x }}
  {%- endraw %}
z)J",
     R"J({{ x }}z)J"},
    {R"J(  {% raw %}
  {{ x }}
  {% endraw %}
z)J",
     R"J(
  {{ x }}
z)J"},
    {R"J({{ 1 }}
{{ 2 }}
)J",
     R"J(1
2)J"},
    {R"J(	{% if true %}	x{% endif %})J",
     R"J(	x)J"},
    {R"J(a
b
{% if true %}
c{% endif %}d)J",
     R"J(a
b
cd)J"},
    {R"J({%- macro m(x) -%}
  [{{ x }}]
{%- endmacro -%}
{{ m(1) }}
{{ m(2) }})J",
     R"J([1]
[2])J"},
    {R"J(x {%+ if true +%}
 y {% endif %})J",
     R"J(x 
 y )J"},
    {R"J({{- '  a  ' -}}

  b  {{- ' c ' }})J",
     R"J(  a  b c )J"},
    {R"J(a {%- if true -%} b {%- endif -%} c)J",
     R"J(abc)J"},
    {R"J({{ 1 }}  {% if true %}y{% endif %})J",
     R"J(1  y)J"},
};
template <size_t N>
void check_cases(const RenderCase (&cases)[N]) {
  const auto ctx = nlohmann::ordered_json::parse(kContext);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.tmpl);
    auto t = ChatTemplate::parse(c.tmpl);
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    auto out = t->render_ordered(ctx);
    ASSERT_TRUE(out.ok()) << out.error().to_string();
    EXPECT_EQ(*out, c.expected);
  }
}

TEST(ChatTemplateRender, Statements) { check_cases(kStatementsCases); }
TEST(ChatTemplateRender, Filters) { check_cases(kFiltersCases); }
TEST(ChatTemplateRender, Tojson) { check_cases(kTojsonCases); }
TEST(ChatTemplateRender, Tests) { check_cases(kTestsCases); }
TEST(ChatTemplateRender, Operators) { check_cases(kOperatorsCases); }
TEST(ChatTemplateRender, Slicing) { check_cases(kSlicingCases); }
TEST(ChatTemplateRender, AttributeItemAndMethodAccess) { check_cases(kAccessCases); }
TEST(ChatTemplateRender, PythonPrinting) { check_cases(kPrintingCases); }
TEST(ChatTemplateRender, WhitespaceControl) { check_cases(kWhitespaceCases); }

}  // namespace
}  // namespace strata::tokenizer
