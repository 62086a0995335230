use strict; use warnings; $| = 1; no warnings 'once';
use feature 'lexical_subs'; no warnings 'experimental::lexical_subs';
use feature 'try'; no warnings 'experimental::try';

sub show {
    my $tag = shift;
    print "== $tag\n";
    main::probe_walk();
    my $i = 0;
    while (my @f = caller($i)) {
        printf "  caller(%d): sub=%s file=%s line=%d\n", $i, $f[3], $f[1], $f[2];
        $i++;
    }
}

package Foo::Bar;
sub leaf { main::show("named sub Foo::Bar::leaf") }
sub via_anon { my $f = sub { main::show("anon sub inside Foo::Bar::via_anon") }; $f->(); }
sub via_eval_block { eval { main::show("eval block inside Foo::Bar::via_eval_block") }; }
sub via_eval_str { eval q{ main::show("string eval inside Foo::Bar::via_eval_str") }; die $@ if $@; }
sub via_sort { my @x = sort { main::show("sort block inside Foo::Bar::via_sort") unless $Foo::Bar::sorted++; $a <=> $b } (2, 1); }
sub by_num { main::show("sort SUBNAME comparator Foo::Bar::by_num") unless $Foo::Bar::sorted2++; $a <=> $b }
sub via_sort_sub { my @x = sort by_num (2, 1); }
my sub lexical { main::show("lexical (my) sub inside Foo::Bar") }
sub via_lexical { lexical() }
sub via_try { try { main::show("try block inside Foo::Bar::via_try") } catch ($e) { die $e } }
sub via_require {
    open my $fh, '>', '/tmp/perl-probe/ProbeReq.pm' or die $!;
    print $fh qq{package ProbeReq;\nmain::show("top level of a require'd file ProbeReq.pm");\n1;\n};
    close $fh;
    local @INC = ('/tmp/perl-probe', @INC);
    require ProbeReq;
}

package main;
sub top { my $what = shift; Foo::Bar->can($what)->() }
top($_) for qw(leaf via_anon via_eval_block via_eval_str via_sort via_sort_sub via_lexical via_try via_require);
show("main program top level");
