#!/usr/bin/env python3
"""Circles of imports between the Rust files of this repository (issue #21: at most 2 circles,
none wider than 2 files). A file imports another when one of its `use` lines (`crate::`,
`super::`, `self::`, braces expanded) names the other's module, tests included; with
`--inline`, also paths written in code (`crate::x::f()`). Prints each circle (strongly
connected set of files) with its edges, then `circles: N`.

Usage: python3 scripts/import_circles.py [--inline] [--tests-excluded] [REPO]"""
import os, re, sys, subprocess
args=[a for a in sys.argv[1:] if not a.startswith('--')]
root = args[0] if args else '.'
files = subprocess.run(['git','-C',root,'ls-files','*.rs'],capture_output=True,text=True).stdout.split()
files += subprocess.run(['git','-C',root,'ls-files','--others','--exclude-standard','*.rs'],capture_output=True,text=True).stdout.split()
crates = {}
for f in files:
    m = re.match(r'(.*?)src/', f)
    if not m: continue
    crates.setdefault(m.group(1), []).append(f)
def modpath(f, base):
    rel = f[len(base)+4:-3]
    parts = rel.split('/')
    if parts[-1] in ('lib','main','mod'): parts = parts[:-1]
    return tuple(parts)
INCL='--tests-excluded' not in sys.argv
INLINE='--inline' in sys.argv
def strip_tests(text):
    if INCL: return text
    i = text.find('#[cfg(test)]\nmod tests')
    return text if i < 0 else text[:i]
edges = {}
for base, fs in crates.items():
    mods = {}
    for f in fs:
        if '/bin/' in f: continue
        mods[modpath(f, base)] = f
    for f in fs:
        if f not in mods.values(): continue
        me = modpath(f, base)
        dirmod = me if os.path.basename(f) in ('mod.rs','lib.rs','main.rs') else me[:-1]
        text = strip_tests(open(os.path.join(root,f)).read())
        text = re.sub(r'//[^\n]*', '', text)
        i = text.find('#[cfg(test)]\nmod tests')
        parts = [(text, 0)] if i < 0 else [(text[:i], 0), (text[i:], 1)]
        uses=[]
        for part, depth in parts:
            us=[re.sub(r'\s+','',u.group(1)) for u in re.finditer(r'\buse\s+([^;]+);', part)]
            if INLINE: us += re.findall(r'(?<![\w:])((?:crate|super)(?:::\w+)+)', part)
            for u in us:
                # inside `mod tests`, the first `super` is this file's module
                if depth and u.startswith('super::'): u = 'self::' + u[len('super::'):]
                uses.append(u)
        for body in uses:
            # expand one level of braces
            paths = []
            def expand(prefix, s):
                m = re.match(r'^(.*?)\{(.*)\}$', s)
                if not m:
                    paths.append(prefix+s); return
                pre, inner = m.group(1), m.group(2)
                depth=0; cur=''
                for ch in inner:
                    if ch=='{': depth+=1
                    if ch=='}': depth-=1
                    if ch==',' and depth==0:
                        expand(prefix+pre, cur); cur=''
                    else: cur+=ch
                if cur: expand(prefix+pre, cur)
            expand('', body)
            for p in paths:
                segs = p.split('::')
                if segs[0]=='crate': cur=(); segs=segs[1:]
                elif segs[0]=='super':
                    cur=me
                    while segs and segs[0]=='super': cur=cur[:-1]; segs=segs[1:]
                elif segs[0]=='self': cur=me; segs=segs[1:]
                else: continue
                # longest module prefix
                best=None; path=cur
                for s in segs:
                    path=path+(s,)
                    if path in mods: best=path
                if best is None and cur in mods: best=cur
                if best is None: continue
                tgt=mods[best]
                if tgt!=f: edges.setdefault(f,set()).add(tgt)
# Tarjan SCC
idx={}; low={}; st=[]; on=set(); sccs=[]; n=[0]
sys.setrecursionlimit(10000)
def sc(v):
    idx[v]=low[v]=n[0]; n[0]+=1; st.append(v); on.add(v)
    for w in edges.get(v,()):
        if w not in idx: sc(w); low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        c=[]
        while True:
            w=st.pop(); on.discard(w); c.append(w)
            if w==v: break
        if len(c)>1: sccs.append(c)
for v in list(edges): 
    if v not in idx: sc(v)
for c in sccs:
    print(len(c), ' '.join(sorted(c)))
    for a in sorted(c):
        print('   ', a, '->', ' '.join(sorted(t for t in edges.get(a,()) if t in c)))
print('circles:', len(sccs))
