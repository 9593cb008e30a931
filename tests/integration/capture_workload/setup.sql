CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE t_types (
  id int PRIMARY KEY, c_small smallint, c_big bigint, c_real real, c_double double precision,
  c_num numeric(10,2), c_numv numeric, c_bool boolean, c_text text, c_vc varchar(10), c_char char(3),
  c_uuid uuid, c_json json, c_jsonb jsonb, c_bytea bytea, c_date date, c_time time, c_time3 time(3), c_time0 time(0),
  c_ts timestamp, c_ts3 timestamp(3), c_ts0 timestamp(0), c_tstz timestamptz, c_interval interval, c_mood mood,
  c_intarr int[], c_textarr text[], c_numarr numeric(5,1)[], c_boolarr boolean[], c_serial bigserial
);
CREATE TABLE t_default (id int PRIMARY KEY, a text, b int);
CREATE TABLE t_full (id int PRIMARY KEY, a text, b int);
ALTER TABLE t_full REPLICA IDENTITY FULL;
CREATE TABLE t_index (id int PRIMARY KEY, u int NOT NULL, a text);
CREATE UNIQUE INDEX t_index_u ON t_index (u);
ALTER TABLE t_index REPLICA IDENTITY USING INDEX t_index_u;
CREATE TABLE t_nothing (id int PRIMARY KEY, a text);
ALTER TABLE t_nothing REPLICA IDENTITY NOTHING;
CREATE TABLE t_nopk (a text, b int);
CREATE TABLE t_toast (id int PRIMARY KEY, big text, small int);
ALTER TABLE t_toast ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE TABLE t_e (
  id int PRIMARY KEY, n numeric, n52 numeric(5,2), n5 numeric(5), r real, d double precision,
  ts timestamp, tstz timestamptz, tstz0 timestamptz(0), tstz3 timestamptz(3), dt date, tm time, tm6 time(6), tm4 time(4),
  ts4 timestamp(4), iv interval, iv2 interval day to second(3),
  c_def_text text DEFAULT 'dflt', c_def_int int NOT NULL DEFAULT 42, c_now timestamptz NOT NULL DEFAULT now(),
  c_uuid_nn uuid NOT NULL DEFAULT gen_random_uuid(), c_textnn text NOT NULL DEFAULT '', c_bool_nn boolean NOT NULL DEFAULT true,
  c_num_nn numeric(6,2) NOT NULL DEFAULT 1.5, c_date_nn date NOT NULL DEFAULT '2020-01-01', c_vc varchar NOT NULL DEFAULT 'v'::character varying,
  c_dbl_nn double precision NOT NULL DEFAULT 2.5, c_bytea_nn bytea NOT NULL DEFAULT '\x00', c_json_nn jsonb NOT NULL DEFAULT '{}',
  c_ts_nn timestamp NOT NULL DEFAULT '2020-01-01 00:00:00', c_arr_nn int[] NOT NULL DEFAULT '{}', c_big_nn bigint NOT NULL DEFAULT -7,
  c_tm_nn time NOT NULL DEFAULT '01:00', c_iv_nn interval NOT NULL DEFAULT '1 day', c_char char(2) DEFAULT 'ab'
);
CREATE TABLE t_toast2 (id int PRIMARY KEY, ta text[], ia int[], ba bytea, jb jsonb, small int);
ALTER TABLE t_toast2 ALTER COLUMN ta SET STORAGE EXTERNAL, ALTER COLUMN ia SET STORAGE EXTERNAL, ALTER COLUMN ba SET STORAGE EXTERNAL, ALTER COLUMN jb SET STORAGE EXTERNAL;
CREATE TABLE t_full_nopk (a text, b int);
ALTER TABLE t_full_nopk REPLICA IDENTITY FULL;
CREATE TABLE t_pk2 (a int, b text, c int, PRIMARY KEY (b, a));
CREATE TABLE t_ddl (id int PRIMARY KEY, name text, b text, n int NOT NULL DEFAULT 3, p numeric(5,2));
CREATE TABLE t_trunc (id int PRIMARY KEY, v text);
CREATE TABLE t_trunc2 (v text);
CREATE TABLE t_pkhdr (n numeric(6,2), s text, b bytea, v int, PRIMARY KEY (n, s, b));
CREATE EXTENSION hstore;
CREATE EXTENSION ltree;
CREATE EXTENSION citext;
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN price AS numeric(8,3);
CREATE DOMAIN price2 AS price NOT NULL;
CREATE DOMAIN tags AS text[];
CREATE DOMAIN nn_text AS text NOT NULL DEFAULT 'dd';
CREATE DOMAIN cash AS money;
CREATE TABLE t_money (id int PRIMARY KEY, m money, m_nn money NOT NULL DEFAULT 0, n numeric(10,2), nv numeric, small int);
CREATE TABLE t_timetz (id int PRIMARY KEY, ttz timetz, ttz3 timetz(3), ttz_nn timetz NOT NULL DEFAULT '01:00+02', a_ttz timetz[], tm time, tm3 time(3), ts timestamp, ts3 timestamp(3), dt date, iv interval, iv_nn interval NOT NULL DEFAULT '1 day');
CREATE TABLE t_net (id int PRIMARY KEY, i inet, c cidr, mac macaddr, mac8 macaddr8, i_nn inet NOT NULL DEFAULT '127.0.0.1', a_i inet[], a_c cidr[], a_mac macaddr[], a_mac8 macaddr8[]);
CREATE TABLE t_geo (id int PRIMARY KEY, pt point, pt_nn point NOT NULL DEFAULT '(1,2)');
CREATE TABLE t_hstore (id int PRIMARY KEY, hs hstore, hs_nn hstore NOT NULL DEFAULT '', a_hs hstore[]);
CREATE TABLE t_bits (id int PRIMARY KEY, b1 bit(1), b3 bit(3), b10 bit(10), b70 bit(70), vb varbit, vb5 varbit(5), b3_nn bit(3) NOT NULL DEFAULT B'101', b1_d bit(1) DEFAULT B'0', vb_nn varbit NOT NULL DEFAULT B'1');
CREATE TABLE t_text2 (id int PRIMARY KEY, tv tsvector, x xml, lt ltree, ct citext, ct_nn citext NOT NULL DEFAULT 'x', x_nn xml NOT NULL DEFAULT '<a/>', tv_nn tsvector NOT NULL DEFAULT 'a', lt_nn ltree NOT NULL DEFAULT 'a.b', a_ct citext[], a_lt ltree[], o oid, o_nn oid NOT NULL DEFAULT 7, a_tv tsvector[], a_o oid[]);
CREATE TABLE t_range (id int PRIMARY KEY, r4 int4range, r8 int8range, rn numrange, rts tsrange, rtz tstzrange, rd daterange, r4_nn int4range NOT NULL DEFAULT '[1,2)', a_r4 int4range[], a_rtz tstzrange[], a_rd daterange[]);
CREATE TABLE t_domain (id posint PRIMARY KEY, d1 posint, d2 price, d3 tags, d4 nn_text, d5 posint DEFAULT 5, d6 price2, d7 cash);
CREATE TABLE t_toast3 (id int PRIMARY KEY, hs hstore, x xml, ct citext, tv tsvector, small int);
ALTER TABLE t_toast3 ALTER COLUMN hs SET STORAGE EXTERNAL, ALTER COLUMN x SET STORAGE EXTERNAL, ALTER COLUMN ct SET STORAGE EXTERNAL, ALTER COLUMN tv SET STORAGE EXTERNAL;
CREATE TABLE t_end (id int PRIMARY KEY);
