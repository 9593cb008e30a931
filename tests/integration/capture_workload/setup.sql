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
